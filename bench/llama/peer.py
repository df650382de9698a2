#!/usr/bin/env python3
"""The PyTorch side of bench/llama: transformers' LlamaForCausalLM loaded from the same
directory as the worker, trained with the worker's step on the worker's batches: fp32 master
weights under bf16 autocast (on CUDA; fp32 on the CPU), the cross-entropy in fp32, the global
gradient norm clipped at 1.0, AdamW (betas 0.9/0.95, eps 1e-8, decoupled decay on the matrices
only, fused on CUDA), linear warm-up then cosine decay to 10% of the peak.

  peer.py --model DIR --data FILE --mode compile|eager --steps N --batch B --seq T
          --lr LR --warmup W --weight-decay WD --seed S --skip K --out RESULT.json

Writes every step's loss and the tokens/s over the steps after --skip (the compiled step's
compilation falls in the first ones). With --profile TRACE.json, the --profile-steps (3) steps
after --skip are recorded by torch.profiler (CPU and CUDA) and exported as a Chrome trace.
"""
import argparse, json, math, os, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import batch, token_stream  # noqa: E402


def lr_at(step, peak, warmup, total):
    low = peak * 0.1
    if step <= warmup:
        return peak * step / max(warmup, 1)
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return low + (peak - low) * 0.5 * (1 + math.cos(math.pi * progress))


def main():
    p = argparse.ArgumentParser()
    for name, kind in (("model", str), ("data", str), ("mode", str), ("out", str), ("steps", int),
                       ("batch", int), ("seq", int), ("lr", float), ("warmup", int),
                       ("weight-decay", float), ("seed", int), ("skip", int)):
        p.add_argument(f"--{name}", type=kind, required=True)
    p.add_argument("--profile")
    p.add_argument("--profile-steps", type=int, default=3)
    a = p.parse_args()
    from transformers import LlamaForCausalLM
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LlamaForCausalLM.from_pretrained(a.model, dtype=torch.float32,
                                             attn_implementation="sdpa").to(dev)
    model.train()
    decay = [q for q in model.parameters() if q.dim() >= 2]
    rest = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    vocab = model.config.vocab_size

    def loss_of(x, y):
        with amp:
            logits = model(input_ids=x).logits
        return F.cross_entropy(logits.float().reshape(-1, vocab), y.reshape(-1))

    step_loss = torch.compile(loss_of) if a.mode == "compile" else loss_of
    stream = token_stream(a.model, a.data)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    losses, t0, t_first, prof = [], None, None, None
    start = time.time()
    for step in range(1, a.steps + 1):
        if a.profile and step == a.skip + 1:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if dev.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            prof = torch.profiler.profile(activities=activities)
            prof.__enter__()
        xs, ys = batch(stream, a.seed, step, a.batch, a.seq)
        x = torch.tensor(xs, device=dev)
        y = torch.tensor(ys, device=dev)
        loss = step_loss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, a.warmup, a.steps)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if prof is not None and (step == a.skip + a.profile_steps or step == a.steps):
            sync()
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(a.profile)
            prof = None
        if step == 1:
            sync()
            t_first = time.time() - start
        if step == a.skip:
            sync()
            t0 = time.time()
    sync()
    elapsed = time.time() - t0
    tokens = (a.steps - a.skip) * a.batch * a.seq
    result = {"mode": a.mode, "tokens_per_s": tokens / elapsed, "first_step_s": t_first,
              "losses": [v.item() for v in losses]}
    with open(a.out, "w") as f:
        json.dump(result, f)
    print(json.dumps({k: v for k, v in result.items() if k != "losses"}), flush=True)


if __name__ == "__main__":
    main()
