"""Seed 000's pipeline as Python stages: a small GPT-2 (built from a config, no hub download)
trained with Hugging Face Accelerate on byte-level synthetic text ("pretrain"), then
fine-tuned from that checkpoint on instruction pairs ("sft"). Each phase is one orchestrate
stage, i.e. one fresh process: nothing of pretrain's optimizer, engine or cache survives into
SFT. Reports through python/orchestrate_stage.py (rank 0 only).

    python3 train_accelerate.py --phase pretrain --out DIR [--steps N]
    python3 train_accelerate.py --phase sft --init PRETRAIN_DIR --out DIR [--steps N]
    python3 train_accelerate.py --phase sft --init DIR --data SAMPLE.jsonl --out DIR

With --data, SFT trains on a JSONL file of {"prompt": ..., "completion": ...} lines (one
dataset sample of seed 001's loop) instead of generated pairs.
"""
import json
import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import orchestrate_stage as stage  # noqa: E402
import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

WORDS = "cat dog frog bird fish duck red blue green old small big sees likes finds hears".split()


def batch(rng, phase, size, seq, pairs=None):
    rows = []
    for _ in range(size):
        text = ""
        while len(text) < seq:
            if pairs:
                prompt, completion = rng.choice(pairs)
                text += prompt + completion
                continue
            ws = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
            text += f"upper: {ws}\n{ws.upper()}\n" if phase == "sft" else f"the {ws}. "
        rows.append(list(text.encode()[:seq]))
    return torch.tensor(rows)


def weight_sum(model):
    """Sum of every weight's magnitude, in float64: the same number for the same weights, so a
    downstream stage can show it began from exactly what its upstream saved."""
    return sum(p.detach().double().abs().sum().item() for p in model.parameters())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["pretrain", "sft"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--init")
    p.add_argument("--data", help="JSONL prompt/completion file to fine-tune on")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()

    torch.manual_seed(0 if args.phase == "pretrain" else 1)
    accelerator = Accelerator(mixed_precision="bf16" if torch.cuda.is_available() else "no")
    if args.init:
        model = GPT2LMHeadModel.from_pretrained(args.init)
    else:
        config = GPT2Config(vocab_size=256, n_positions=args.seq, n_embd=512, n_layer=6, n_head=8,
                            bos_token_id=10, eos_token_id=10)
        model = GPT2LMHeadModel(config)
    init_weight_sum = weight_sum(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    rng = random.Random(0 if args.phase == "pretrain" else 1)
    pairs = None
    if args.data:
        with open(args.data) as f:
            pairs = [(r["prompt"], r["completion"]) for r in map(json.loads, f) if r]
    if accelerator.is_main_process:
        stage.started(device=str(accelerator.device))
    t0 = time.time()
    first = None
    for step in range(1, args.steps + 1):
        x = batch(rng, args.phase, args.batch, args.seq, pairs).to(accelerator.device)
        loss = model(input_ids=x, labels=x).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == 1:
            first = loss.item()
        if accelerator.is_main_process and (step % 25 == 0 or step == args.steps):
            stage.progress(step, total_steps=args.steps, loss=loss.item(),
                           tokens_per_s=step * args.batch * args.seq / (time.time() - t0))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(args.out, safe_serialization=True)
        stage.checkpoint(os.path.join(args.out, "model.safetensors"), step=args.steps)
        stage.metrics(first_loss=first, final_loss=loss.item(), steps=args.steps,
                      train_wall_s=time.time() - t0, init_weight_sum=init_weight_sum,
                      final_weight_sum=weight_sum(accelerator.unwrap_model(model)))


if __name__ == "__main__":
    main()
