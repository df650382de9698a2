"""DistributedDataParallel training under torchrun as an orchestrate stage: gloo on the CPU,
NCCL with one process per GPU when there are enough GPUs. Every rank trains; rank 0 reports
through orchestrate_stage and writes the checkpoint. On SIGTERM (orchestrate stopping the
stage) the ranks agree on the stop (one all-reduce per step), rank 0 saves ckpt.pt and every
rank exits 75; the next attempt continues from it. See plan.toml beside it.

    torchrun --nproc-per-node 2 train_ddp.py [--steps N]
"""
import argparse
import os
import random
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import orchestrate_stage as stage
from bytelm import ByteLM, batch


def save(path, model, opt, step):
    """Writes a checkpoint atomically: a temporary file, then a rename."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help="sequences per rank and step")
    args = p.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    if gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{local_rank}" if gpu else "cpu")
    stage.watch_stop()  # SIGTERM now only sets stage.stop_requested()

    torch.manual_seed(0)
    model = ByteLM().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    out = stage.output_dir()
    start = 0
    resume = stage.resume_dir()
    if resume and (resume / "ckpt.pt").exists():
        state = torch.load(resume / "ckpt.pt", map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    ddp = DDP(model, device_ids=[local_rank] if gpu else None)
    if rank == 0:
        stage.started(device=f"{device} x{world} ({dist.get_backend()})")
        if start:
            stage.metrics(resumed_from_step=start)
    t0, last_report = time.time(), 0.0
    for step in range(start, args.steps):
        rng = random.Random(step * world + rank)  # each rank its own data, resumable by step
        loss = ddp(batch(rng, args.batch, args.seq).to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        stop = torch.tensor([1 if stage.stop_requested() else 0], device=device)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if rank == 0 and (time.time() - last_report >= 0.5 or step + 1 == args.steps):
            last_report = time.time()
            tokens = (step + 1 - start) * args.batch * args.seq * world
            stage.progress(step + 1, total_steps=args.steps, loss=loss.item(),
                           tokens_per_s=tokens / (time.time() - t0))
        if stop.item():
            if rank == 0:
                save(out / "ckpt.pt", model, opt, step + 1)
                stage.checkpoint(out / "ckpt.pt", step=step + 1)
            dist.barrier()
            del ddp
            dist.destroy_process_group()
            if rank == 0:
                stage.exit_interrupted(f"stopped by SIGTERM at step {step + 1}, saved ckpt.pt")
            raise SystemExit(stage.EXIT_INTERRUPTED)
    if rank == 0:
        save(out / "model.pt", model, opt, args.steps)
        stage.checkpoint(out / "model.pt", step=args.steps)
        stage.metrics(final_loss=loss.item(), steps=args.steps, world_size=world,
                      train_wall_s=time.time() - t0)
    dist.barrier()
    # The DDP wrapper's reducer holds the process group: dropped first, so that the group is
    # torn down once, here, and not by the reducer's destructor as the interpreter exits.
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
