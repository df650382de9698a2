"""A GPU stage for the web view's H200 capture: trains a small MLP on random data while it
takes GiB-sized buffers step by step (so the memory curve climbs), reports progress and loss on
the stage's event socket, logs each step on stderr, then exits (its memory goes with it).

    python3 stage.py STEPS GIB_PER_STEP
"""
import json
import os
import socket
import sys
import time

import torch

steps, gib = int(sys.argv[1]), float(sys.argv[2])
events = socket.socket(socket.AF_UNIX)
events.connect(os.environ["ORCHESTRATE_EVENTS"])


def send(obj):
    events.sendall((json.dumps({"v": 1, **obj}) + "\n").encode())


torch.manual_seed(0)
dev = torch.device("cuda")
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(8192, 1024, device=dev)
y = x[:, :1] * 0.5
held = []
for step in range(1, steps + 1):
    held.append(torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device=dev))
    for _ in range(50):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    send({"event": "progress", "step": step, "total_steps": steps, "loss": loss.item()})
    print(f"step {step}/{steps} loss {loss.item():.5f} allocated {torch.cuda.memory_allocated() / 2**30:.1f} GiB", file=sys.stderr, flush=True)
    time.sleep(1.0)
send({"event": "metrics", "metrics": {"loss": loss.item(), "held_gib": len(held) * gib}})
