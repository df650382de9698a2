"""A GPU stage for the daemon's placement check: allocates GIB GiB on the GPU it was given
(CUDA_VISIBLE_DEVICES, set by orchestrate), holds it SECONDS, reports where it ran.

    python3 hold_gpu.py GIB SECONDS
"""
import json
import os
import sys
import time

import torch

gib, seconds = float(sys.argv[1]), float(sys.argv[2])
start = time.time()
x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
time.sleep(seconds)
out = os.environ.get("ORCHESTRATE_OUTPUT_DIR", ".")
with open(os.path.join(out, "where.json"), "w") as f:
    json.dump({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start,
               "end": time.time(), "gib": gib}, f)
