"""A tiny GPU stage: a CUDA tensor, a sum, a file. With a barrier directory and a count, it
also waits (up to 60 s) until that many stages have reached the barrier, so that they overlap
on the GPU. With `leak`, it leaves a process in a new session holding 1 GiB of the GPU and
exits as soon as that process has its memory. It writes `phases.json` beside its output: the
wall-clock moments (Unix seconds) of its first line, its imports done, CUDA initialised, its first allocation, the
sum read back, and its last line, for `phases.py`."""
import time

first_line = time.time()
import json
import os
import subprocess
import sys

import torch

import orchestrate_stage as stage

imported = time.time()

name = stage.stage_name()
stage.cap_gpu_memory()
torch.cuda.init()
cuda_ready = time.time()
x = torch.ones(1 << 20, device="cuda")
allocated = time.time()
total = float(x.sum())
summed = time.time()
if len(sys.argv) > 2:
    barrier, count = sys.argv[1], int(sys.argv[2])
    os.makedirs(barrier, exist_ok=True)
    open(os.path.join(barrier, name), "w").close()
    deadline = time.time() + 60
    while len(os.listdir(barrier)) < count and time.time() < deadline:
        time.sleep(0.02)
    if "leak" in sys.argv[3:]:
        ready = str(stage.output_dir() / "child-ready")
        holder = (
            "import sys, time, torch\n"
            "x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\n"
            "torch.cuda.synchronize()\n"
            "open(sys.argv[1], 'w').close()\n"
            "time.sleep(600)\n"
        )
        subprocess.Popen([sys.executable, "-c", holder, ready], start_new_session=True)
        while not os.path.exists(ready):
            time.sleep(0.05)
    time.sleep(0.5)
(stage.output_dir() / "sum.txt").write_text(f"{total}\n")
moments = dict(first_line=first_line, imported=imported, cuda_ready=cuda_ready, allocated=allocated, summed=summed, last_line=time.time())
(stage.output_dir() / "phases.json").write_text(json.dumps(moments))
