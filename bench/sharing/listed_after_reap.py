#!/usr/bin/env python3
"""Does the driver still list a process after it has been reaped? (the premise of the shared
verdict's rule that a reaped main process still listed is waited for, not left behind)

`listed_after_reap.py [WAVES]`: WAVES times, four children forked from a parent that imported
torch (CUDA not initialised in it) each make a CUDA tensor and exit; the parent reaps each and
at once, then every 2 ms, reads NVML's compute processes until the reaped PID is gone.
Prints, per child, how long its PID stayed listed after its reaping (0 when it was not listed
at the first look).
"""
import os
import sys
import time

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
import pynvml  # noqa: E402
import torch  # noqa: E402,F401

waves = int(sys.argv[1]) if len(sys.argv) > 1 else 10


def child():
    import torch
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    _ = float(x.sum())
    os._exit(0)


pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)


def listed():
    return {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


stays = []
for _ in range(waves):
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            child()
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
        reaped = time.monotonic()
        first = pid in listed()
        while pid in listed():
            time.sleep(0.002)
        stays.append((time.monotonic() - reaped) * 1e3 if first else 0.0)
stays.sort()
still = [s for s in stays if s > 0]
print(f"{len(stays)} children, {len(still)} still listed after their reaping; "
      f"longest {max(stays):.1f} ms; those listed: {', '.join(f'{s:.1f}' for s in still[:40])} ms")
