#!/usr/bin/env python3
"""The throughput peers: the byte-level GPT of bench/gpu/bytelm.py (the same shape and the
same training step as stage-worker's built-in `train`: bf16 autocast, SDPA, fp32 masters,
global grad-norm clipping at 1.0, fused AdamW with betas (0.9, 0.95)), in PyTorch eager or
under torch.compile.

  peer.py --mode eager|compile [--profile TRACE.json] SHAPE...

Prints one JSON line: tokens_per_s over the steps after --skip (the compiled peer's
recompiles, if any, fall in the first steps), and the first step's wall time. With
--profile, steps skip+1..skip+3 are recorded with torch.profiler and exported as a Chrome
trace (the throughput of such a run is not a figure to quote).
"""
import argparse, json, os, sys, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu"))
from bytelm import ByteLM  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["eager", "compile"], required=True)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--profile")
    a = p.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    with dev:
        model = ByteLM(a.d_model, a.layers, a.heads, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01,
                            fused=dev.type == "cuda")
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")

    def loss_of(ids):
        with amp:
            logits = model(ids[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, 256), ids[:, 1:].reshape(-1))

    step_loss = torch.compile(loss_of) if a.mode == "compile" else loss_of
    gen = torch.Generator(device=dev).manual_seed(0)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    prof = None
    t_first = t0 = None
    t_start = time.time()
    for step in range(1, a.steps + 1):
        if a.profile and step == a.skip + 1:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        ids = torch.randint(0, 256, (a.batch, a.seq + 1), device=dev, generator=gen)
        loss = step_loss(ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if prof is not None and step == a.skip + 3:
            sync()
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(a.profile)
            prof = None
        if step == 1:
            loss.item()
            t_first = time.time() - t_start
        if step == a.skip:
            sync()
            t0 = time.time()
    loss.item()
    sync()
    wall = time.time() - t0
    tokens = a.batch * a.seq * (a.steps - a.skip)
    print(json.dumps({"mode": a.mode, "tokens_per_s": tokens / wall, "steady_steps": a.steps - a.skip,
                      "first_step_s": t_first, "final_loss": loss.item(),
                      "parameters": sum(q.numel() for q in model.parameters())}), flush=True)


if __name__ == "__main__":
    main()
