#!/usr/bin/env python3
"""The peer of the headline comparison: N training stages in ONE Python process, the way the
seeds do it (train, save, "clean up" with del + gc.collect() + torch.cuda.empty_cache(), next
stage), with one stray reference kept per stage (a list that holds each stage's model and
optimizer, as a logging or evaluation helper easily does).

Prints one JSON object: device-level used memory (NVML) after each stage's cleanup.
The model is the same byte-level decoder-only transformer the built-in stage worker trains.
"""
import argparse, gc, json, math, os, time

import pynvml
import torch
import torch.nn.functional as F


from bytelm import ByteLM


def nvml_handle():
    """The NVML handle of the GPU this process will compute on, found without creating a CUDA
    context (which would move the "before" reading). NVML numbers GPUs as the host does and
    ignores CUDA_VISIBLE_DEVICES, so its first entry is mapped here (an index or a UUID)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.startswith("GPU-"):
        return pynvml.nvmlDeviceGetHandleByUUID(first)
    return pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--stages", type=int, default=5)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--stray-reference", action="store_true")
    p.add_argument("--eval-batches", type=int, default=0,
                   help="after each stage's training, this many no-grad forward passes (an eval)")
    args = p.parse_args()

    pynvml.nvmlInit()
    handle = nvml_handle()
    used_mib = lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20

    result = {"before_mib": used_mib(), "after_stage_mib": [], "stage_wall_s": [], "tokens_per_s": []}
    kept = []  # the stray references
    torch.manual_seed(0)
    for stage in range(args.stages):
        t0 = time.time()
        model = ByteLM(args.d_model, args.layers, args.heads, args.seq).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        for step in range(args.steps):
            x = torch.randint(0, 256, (args.batch, args.seq + 1), device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, 256), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            for _ in range(args.eval_batches):
                x = torch.randint(0, 256, (args.batch, args.seq + 1), device="cuda")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(x[:, :-1])
        torch.cuda.synchronize()
        wall = time.time() - t0
        torch.save(model.state_dict(), f"/tmp/one_process_stage{stage}.pt")
        if args.stray_reference:
            kept.append((model, opt))
        # The seeds' cleanup.
        model = model.cpu()
        del model, opt, logits, loss, x
        gc.collect()
        torch.cuda.empty_cache()
        result["after_stage_mib"].append(used_mib())
        result["stage_wall_s"].append(wall)
        result["tokens_per_s"].append(args.steps * args.batch * args.seq / wall)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
