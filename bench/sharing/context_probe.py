"""How CUDA contexts made at once on one GPU compete (issue 47: why four tiny stages sharing a
GPU do not run four times as fast as one).

A process that imported torch (CUDA not initialised, as in a zygote) forks WIDTH children at
once; each initialises CUDA (`torch.cuda.init()`), makes its first tensor (which makes the
device's primary context), sums it and exits with `os._exit`. Per child: init, first tensor
(context), and the whole child from fork to reaped; per wave: from the first fork to the last
reap, and the rate that gives. Widths 1, 2, 4 and 8, WAVES waves each, alternating.

Run it once plainly and once with CUDA_MPS_PIPE_DIRECTORY naming a running MPS control
daemon (context_probe.sh does both) to see what a shared server context changes.

With PROBE=raw a child calls the driver itself (`libcuda` through ctypes: `cuInit`, the
primary context retained and made current, 4 MiB allocated, a synchronize) instead of
PyTorch: what the driver's context costs without what PyTorch does around it. WIDTHS (default
"1 2 4 8") picks the widths. context_env.sh runs it under several CUDA settings.

Prints one JSON object: {"mps": bool, "probe": "torch"|"raw", "env": {...}, "widths": {W:
{"init_ms": ..., "context_ms": ..., "child_ms": ..., "wave_ms": ..., "stages_per_s": ...}}},
each a median, min, max and n.
Usage: python3 context_probe.py [WAVES]
"""
import json
import os
import statistics
import sys
import time

import torch

WAVES = int(sys.argv[1]) if len(sys.argv) > 1 else 4
WIDTHS = tuple(int(w) for w in os.environ.get("WIDTHS", "1 2 4 8").split())
RAW = os.environ.get("PROBE") == "raw"


def raw_context():
    """cuInit, then the primary context, 4 MiB and a synchronize, straight from the driver;
    returns the moments after cuInit and after the synchronize."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")

    def check(rc, what):
        if rc != 0:
            raise SystemExit(f"{what}: CUresult {rc}")

    check(cuda.cuInit(0), "cuInit")
    t1 = time.time()
    dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    check(cuda.cuMemAlloc_v2(ctypes.byref(ptr), 4 << 20), "cuMemAlloc")
    check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    return t1, time.time()


def child(pipe):
    t0 = time.time()
    if RAW:
        t1, t2 = raw_context()
        os.write(pipe, f"{t0} {t1} {t2}\n".encode())
        os.close(pipe)
        os._exit(0)
    torch.cuda.init()
    t1 = time.time()
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    t2 = time.time()
    float(x.sum())
    os.write(pipe, f"{t0} {t1} {t2}\n".encode())
    os.close(pipe)
    os._exit(0)


def wave(width):
    start = time.time()
    started = []
    for _ in range(width):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(w)
        os.close(w)
        started.append((pid, r, time.time()))
    lines = {}
    for pid, r, _ in started:
        with os.fdopen(r) as f:
            lines[pid] = f.read().split()
    reaped = {}
    while len(reaped) < width:
        pid, status = os.wait()
        if status != 0:
            sys.exit(f"a child failed: status {status}")
        reaped[pid] = time.time()
    per_child = []
    for pid, _, forked in started:
        t0, t1, t2 = map(float, lines[pid])
        per_child.append((t1 - t0, t2 - t1, reaped[pid] - forked))
    return per_child, max(reaped.values()) - start


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def main():
    seen = {w: {"init": [], "context": [], "child": [], "wave": []} for w in WIDTHS}
    for _ in range(WAVES):
        for width in WIDTHS:
            per_child, wall = wave(width)
            for init, context, whole in per_child:
                seen[width]["init"].append(init * 1e3)
                seen[width]["context"].append(context * 1e3)
                seen[width]["child"].append(whole * 1e3)
            seen[width]["wave"].append(wall * 1e3)
    out = {"mps": bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")),
           "probe": "raw" if RAW else "torch",
           "env": {k: v for k, v in os.environ.items() if k.startswith(("CUDA_", "PROBE"))},
           "torch": torch.__version__, "waves": WAVES, "widths": {}}
    for width, s in seen.items():
        out["widths"][width] = {
            "init_ms": spread(s["init"]),
            "context_ms": spread(s["context"]),
            "child_ms": spread(s["child"]),
            "wave_ms": spread(s["wave"]),
            "stages_per_s": spread([width / (ms / 1e3) for ms in s["wave"]]),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
