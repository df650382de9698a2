"""Another user's process on the GPU: started outside orchestrate, it takes MIB of device
memory on the GPU named by UUID, holds it SECONDS, and exits. Prints when it held and let go."""
import json
import os
import sys
import time

uuid, mib, seconds, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
import pynvml

pynvml.nvmlInit()
index = pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid.encode()))
os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
import torch

block = torch.empty(mib << 20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
held = time.time()
time.sleep(seconds)
del block
released = time.time()
with open(out, "w") as f:
    json.dump({"pid": os.getpid(), "held_unix": held, "released_unix": released, "mib": mib}, f)
