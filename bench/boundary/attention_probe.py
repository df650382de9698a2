#!/usr/bin/env python3
"""What the first scaled_dot_product_attention of a fresh CUDA process costs, per backend.

The 100M stage's warm-up spends a large part of its time loading the attention kernels into
the new context (docs/boundary.md, section 2). This probe asks, for each backend PyTorch can
pick (and for its default pick), in a fresh process each time: the first forward + backward of
the 100M model's attention shape (batch 32, 16 heads, 256 positions, head size 64, bf16,
causal), the second (steady), and which kernels ran. cuBLAS is loaded first by a matrix product,
so its cost is not counted against any backend.

Usage: attention_probe.py REPS    prints one JSON object (runs interleaved across backends).
"""
import json
import subprocess
import sys

CHILD = r"""
import contextlib, json, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

backend = sys.argv[1]
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
a = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
(a @ w).sum().backward()
torch.cuda.synchronize()
q, k, v = (torch.randn(32, 16, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
           for _ in range(3))


def step():
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    torch.cuda.synchronize()


ctx = contextlib.nullcontext() if backend == "DEFAULT" else sdpa_kernel([getattr(SDPBackend, backend)])
out = {"backend": backend}
try:
    with ctx:
        t = time.perf_counter(); step(); out["first_s"] = time.perf_counter() - t
        t = time.perf_counter(); step(); out["second_s"] = time.perf_counter() - t
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            step()
        out["kernels"] = sorted({e.key for e in p.key_averages()
                                 if any(s in e.key.lower() for s in ("flash", "fmha", "cudnn", "attention", "sdpa", "efficient", "softmax", "sm90", "xmma"))})[:12]
except Exception as e:  # a backend that cannot take this shape says so
    out["error"] = f"{type(e).__name__}: {e}"[:300]
print(json.dumps(out))
"""

BACKENDS = ["DEFAULT", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"]


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    runs = []
    for _ in range(reps):
        for b in BACKENDS:
            r = subprocess.run([sys.executable, "-c", CHILD, b], capture_output=True, text=True)
            line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
            try:
                runs.append(json.loads(line))
            except json.JSONDecodeError:
                runs.append({"backend": b, "error": (r.stderr or "no output")[-300:]})
    summary = {}
    for b in BACKENDS:
        mine = [r for r in runs if r["backend"] == b and "first_s" in r]
        if mine:
            firsts = sorted(r["first_s"] for r in mine)
            summary[b] = {
                "first_s_median": firsts[len(firsts) // 2],
                "first_s_range": [firsts[0], firsts[-1]],
                "second_s_median": sorted(r["second_s"] for r in mine)[len(mine) // 2],
                "kernels": mine[0].get("kernels"),
            }
        else:
            summary[b] = {"error": next((r.get("error") for r in runs if r["backend"] == b), None)}
    print(json.dumps({"torch": __import__("torch").__version__, "summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
