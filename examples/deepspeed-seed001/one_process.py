"""The failure orchestrate fixes: seed 001's loop in ONE Python process. For each dataset
sample: build the model, `deepspeed.initialize` a ZeRO-2 engine, fine-tune, evaluate, then
clean up as the seed's answer recommends (`engine.destroy()`, `destroy_process_group()`,
move the model to the CPU, `del`, `gc.collect()`, `torch.cuda.empty_cache()`), and record the
GPU's memory as torch.cuda and NVML see it. Writes the records to a JSON file after every
iteration, so a crash (out of memory, a second `deepspeed.initialize` that fails) still leaves
them; the error is recorded too. Compare with plan.toml, one fresh process per stage.

    python3 one_process.py --samples ../../configs/data/samples/*.jsonl --out one_process.json \
        [--size 1.1b] [--cleanup seed|answer]

`--cleanup seed` is the question's own code (`optimizer = None; torch.cuda.empty_cache()`),
`--cleanup answer` (the default) the answer's full cleanup above.
"""
import argparse
import ctypes
import gc
import json
import os
import random
import time
import traceback

import deepspeed
import torch

from seed001 import batch, build_model, deepspeed_config, evaluate, load_pairs, single_process_env


class Nvml:
    """Device-level used memory from NVML (libnvidia-ml through ctypes), for the GPU this
    process uses: CUDA_VISIBLE_DEVICES' first entry, an NVML index or a UUID."""

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0, "nvmlInit failed"
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
        self.handle = ctypes.c_void_p()
        if visible.isdigit():
            rc = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(visible)), ctypes.byref(self.handle))
        else:
            rc = self.lib.nvmlDeviceGetHandleByUUID(visible.encode(), ctypes.byref(self.handle))
        assert rc == 0, f"no NVML device for CUDA_VISIBLE_DEVICES={visible}"

    def used_mib(self):
        memory = self._Memory()
        assert self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(memory)) == 0
        return memory.used / 2**20


def snapshot(nvml, label):
    """Memory as PyTorch's allocator and the driver see it now."""
    torch.cuda.synchronize()
    record = {
        "when": label,
        "allocated_mib": torch.cuda.memory_allocated() / 2**20,
        "reserved_mib": torch.cuda.memory_reserved() / 2**20,
    }
    if nvml is not None:
        record["nvml_used_mib"] = nvml.used_mib()
    return record


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", nargs="+", required=True)
    p.add_argument("--out", default="one_process.json")
    p.add_argument("--size", choices=["small", "1.1b"], default="small")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--cleanup", choices=["seed", "answer"], default="answer")
    args = p.parse_args()

    try:
        nvml = Nvml()
    except (OSError, AssertionError) as e:
        print(f"NVML unavailable ({e}): recording torch.cuda figures only")
        nvml = None
    result = {"size": args.size, "cleanup": args.cleanup, "steps": args.steps,
              "baseline": snapshot(nvml, "start"), "iterations": [], "error": None}

    def save():
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    save()
    single_process_env()
    for i, sample in enumerate(args.samples):
        iteration = {"sample": sample, "before": snapshot(nvml, "before engine")}
        result["iterations"].append(iteration)
        try:
            deepspeed.init_distributed(dist_backend="nccl")
            model = build_model(args.size, args.seq)
            engine, optimizer, _, _ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(),
                config=deepspeed_config(args.batch, 3e-4, bf16=True))
            iteration["after_initialize"] = snapshot(nvml, "after initialize")
            pairs = load_pairs(sample)
            t0 = time.time()
            for step in range(args.steps):
                x = batch(pairs, random.Random(step), args.batch, args.seq).to(engine.device)
                loss = engine(input_ids=x, labels=x).loss
                engine.backward(loss)
                engine.step()
            iteration["final_loss"] = loss.item()
            iteration["train_wall_s"] = time.time() - t0
            iteration["eval"] = evaluate(engine.module, pairs, engine.device, args.seq)
            iteration["after_training"] = snapshot(nvml, "after training")
            del loss, x
            if args.cleanup == "seed":
                optimizer = None
                torch.cuda.empty_cache()
            else:
                if hasattr(engine, "destroy"):
                    engine.destroy()
                torch.distributed.destroy_process_group()
                model = engine.module.to("cpu") if hasattr(engine, "module") else engine.to("cpu")
                del model, engine
                optimizer = None
                gc.collect()
                torch.cuda.empty_cache()
            iteration["after_cleanup"] = snapshot(nvml, "after cleanup")
            print(f"sample {i}: {json.dumps(iteration)}", flush=True)
        except Exception as e:  # noqa: BLE001 (the point is to record what happens)
            iteration["error"] = f"{type(e).__name__}: {e}"
            iteration["after_error"] = snapshot(nvml, "after error")
            result["error"] = {"iteration": i, "type": type(e).__name__, "message": str(e),
                               "traceback": traceback.format_exc()}
            save()
            print(f"sample {i} failed: {iteration['error']}", flush=True)
            raise SystemExit(1)
        save()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
