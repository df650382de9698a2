"""How long a Python process with torch and transformers loaded takes to exit, from its last
line to its reaping, as is, with its objects frozen for the collector (`gc.freeze()`, which a
zygote does before each fork), and with `os._exit` (no interpreter shutdown at all: the floor).
Each variant runs RUNS times (default 4), alternating; prints the median and range of each.
Usage: PYTHON=... python3 exit_probe.py [RUNS]"""
import os
import statistics
import subprocess
import sys
import time

CHILD = r'''
import gc, os, sys, time
import torch
import transformers
from transformers import LlamaForCausalLM  # noqa: F401
if sys.argv[1] == "frozen":
    gc.freeze()
x = torch.ones(1000)
print(time.time(), flush=True)
if sys.argv[1] == "os._exit":
    os._exit(0)
'''

python = os.environ.get("PYTHON", sys.executable)
runs = int(sys.argv[1]) if len(sys.argv) > 1 else 4
seen = {"as is": [], "frozen": [], "os._exit": []}
for _ in range(runs):
    for variant in seen:
        child = subprocess.Popen([python, "-c", CHILD, variant], stdout=subprocess.PIPE, text=True)
        last_line = float(child.stdout.readline())
        child.wait()
        seen[variant].append(time.time() - last_line)
for variant, xs in seen.items():
    print(f"{variant:9} median {statistics.median(xs):.3f} s  range {min(xs):.3f}–{max(xs):.3f} s  n={len(xs)}")
