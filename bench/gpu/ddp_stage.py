"""A small torch.distributed (DDP, NCCL) training stage for `torchrun --nproc-per-node=N`:
each rank trains a copy of a small MLP on its GPU for a few steps, gradients all-reduced; rank
0 writes the weights to the stage's output directory and reports metrics on the orchestrator's
channel. Used by bench/gpu/multi_gpu.sh to check one verdict per GPU after a multi-GPU stage.
"""
import json
import os
import socket
import time

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
local = int(os.environ.get("LOCAL_RANK", 0))
torch.cuda.set_device(local)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
hold = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")  # 2 GiB more on every GPU
t0 = time.time()
for step in range(50):
    x = torch.randn(256, 4096, device="cuda")
    loss = ddp(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
if rank == 0:
    out = os.environ["ORCHESTRATE_OUTPUT_DIR"]
    torch.save(model.state_dict(), os.path.join(out, "model.pt"))
    events = os.environ.get("ORCHESTRATE_EVENTS")
    if events:
        s = socket.socket(socket.AF_UNIX)
        s.connect(events)
        msg = {"v": 1, "event": "metrics", "metrics": {"loss": float(loss), "world_size": world,
                                                         "train_s": time.time() - t0}}
        s.sendall((json.dumps(msg) + "\n").encode())
dist.barrier()
dist.destroy_process_group()
