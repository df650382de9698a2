"""Seed 001's fine-tune step as one orchestrate stage: one DeepSpeed ZeRO-2 engine on one
dataset sample, in a process of its own, so that nothing of it (engine, optimizer state,
process group, allocator cache) outlives the stage. Writes the fine-tuned weights
(model.safetensors, config.json) for the eval stage. See plan.toml and README.md beside it.

    python3 finetune.py --sample S.jsonl [--size small|1.1b] [--steps N]   # one GPU, no launcher
    torchrun --nproc-per-node 1 finetune.py --sample S.jsonl                 # the same under torchrun

On SIGTERM it saves a DeepSpeed checkpoint (ds_checkpoint/) and exits 75; the next attempt
loads it and continues.
"""
import argparse
import random
import time

import deepspeed
import torch

import orchestrate_stage as stage
from seed001 import build_model, deepspeed_config, load_pairs, batch, single_process_env


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sample", required=True, help="JSONL file of prompt/completion pairs")
    p.add_argument("--size", choices=["small", "1.1b"], default="small")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=3e-4)
    args = p.parse_args()

    single_process_env()
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
    rank = torch.distributed.get_rank()
    stage.watch_stop()
    model = build_model(args.size, args.seq)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config=deepspeed_config(args.batch, args.lr, bf16=torch.cuda.is_available()))
    out = stage.output_dir()
    start = 0
    resume = stage.resume_dir()
    if resume and (resume / "ds_checkpoint").is_dir():
        path, client = engine.load_checkpoint(str(resume / "ds_checkpoint"))
        if path is not None:
            start = client["step"]
    pairs = load_pairs(args.sample)
    if rank == 0:
        stage.started(device=str(engine.device))
        if start:
            stage.metrics(resumed_from_step=start)
    t0, last = time.time(), 0.0
    for step in range(start, args.steps):
        rng = random.Random(step)
        x = batch(pairs, rng, args.batch, args.seq).to(engine.device)
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        if rank == 0 and (time.time() - last >= 1.0 or step + 1 == args.steps):
            last = time.time()
            stage.progress(step + 1, total_steps=args.steps, loss=loss.item(),
                           tokens_per_s=(step + 1 - start) * args.batch * args.seq / (time.time() - t0))
        if stage.stop_requested():
            engine.save_checkpoint(str(out / "ds_checkpoint"), client_state={"step": step + 1})
            if rank == 0:
                stage.exit_interrupted(f"stopped by SIGTERM at step {step + 1}, saved ds_checkpoint")
            raise SystemExit(stage.EXIT_INTERRUPTED)
    if rank == 0:
        engine.module.save_pretrained(str(out), safe_serialization=True)
        stage.checkpoint(out / "model.safetensors", step=args.steps)
        stage.metrics(final_loss=loss.item(), steps=args.steps, train_wall_s=time.time() - t0,
                      peak_allocated_mib=torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else 0)


if __name__ == "__main__":
    main()
