#!/usr/bin/env python3
"""Where a fresh CUDA process's start goes, at the driver's level, in forked children.

    python3 bench/boundary/cuda_start_probe.py OUT.json [CHILDREN]

A parent that never touches CUDA (as the fork server) forks CHILDREN (default 5) children in
turn. Each one, through libcuda by ctypes, times from its fork: loading libnvrtc (as the fused
kernels do), `cuInit`, creating the primary context, a first allocation and memset, then
tears a context holding 16 GiB down (`cuDevicePrimaryCtxReset`). Between the steps the parent
asks `nvidia-smi` whether the child is listed as a compute process and what the GPU's used
memory is: whether a process that has only run `cuInit` holds anything NVML can see. The
figures decide what a stage may do before its GPU is handed to it.
"""
import ctypes
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time


def smi(pid):
    """(listed, used MiB of the GPU) as nvidia-smi sees them now."""
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True).stdout
    used = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True, text=True).stdout.split()
    listed = any(line.split(",")[0].strip() == str(pid) for line in apps.splitlines() if line)
    return listed, int(used[0]) if used else None


def nvrtc_path():
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    site = os.path.dirname(os.path.dirname(spec.origin))
    found = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so.*")))
    return found[0] if found else None


def child(t0, to_parent, from_parent, nvrtc):
    marks = {}

    def mark(name):
        marks[name] = round(time.perf_counter() - t0, 4)

    def handshake(name):
        os.write(to_parent, (name + "\n").encode())
        os.read(from_parent, 1)

    mark("forked")
    if nvrtc:
        ctypes.CDLL(nvrtc, mode=ctypes.RTLD_GLOBAL)
        mark("nvrtc_loaded")
    cu = ctypes.CDLL("libcuda.so.1")
    mark("libcuda_loaded")
    rc = cu.cuInit(0)
    mark("cu_init")
    handshake("after_init")
    dev = ctypes.c_int()
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    rc |= cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    rc |= cu.cuCtxSetCurrent(ctx)
    mark("context")
    ptr = ctypes.c_uint64()
    rc |= cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(1 << 20))
    rc |= cu.cuMemsetD8_v2(ptr, 0, ctypes.c_size_t(1 << 20))
    rc |= cu.cuCtxSynchronize()
    mark("first_memset")
    handshake("after_context")
    big = ctypes.c_uint64()
    rc |= cu.cuMemAlloc_v2(ctypes.byref(big), ctypes.c_size_t(16 << 30))
    rc |= cu.cuMemsetD8_v2(big, 0, ctypes.c_size_t(16 << 30))
    rc |= cu.cuCtxSynchronize()
    mark("holding_16g")
    handshake("holding")
    t = time.perf_counter()
    rc |= cu.cuDevicePrimaryCtxReset_v2(dev)
    marks["reset_s"] = round(time.perf_counter() - t, 4)
    mark("reset")
    handshake("after_reset")
    marks["rc"] = rc
    os.write(to_parent, ("done " + json.dumps(marks) + "\n").encode())
    os._exit(0)


def one(nvrtc):
    c2p_r, c2p_w = os.pipe()
    p2c_r, p2c_w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(c2p_r)
        os.close(p2c_w)
        child(t0, c2p_w, p2c_r, nvrtc)
    os.close(c2p_w)
    os.close(p2c_r)
    seen = {}
    reader = os.fdopen(c2p_r)
    for line in reader:
        line = line.strip()
        if line.startswith("done "):
            seen["child"] = json.loads(line[5:])
            break
        listed, used = smi(pid)
        seen[line] = {"listed": listed, "used_mib": used}
        os.write(p2c_w, b"x")
    os.waitpid(pid, 0)
    return seen


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    nvrtc = nvrtc_path()
    baseline = smi(-1)[1]
    runs = [one(nvrtc if i % 2 == 0 else None) for i in range(n)]
    result = {"baseline_used_mib": baseline, "nvrtc": nvrtc, "runs": runs}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    for r in runs:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
