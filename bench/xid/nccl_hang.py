"""A one-rank NCCL stage that reports three steps (an all-reduce each), then hangs: orchestrate
judges it hung after its stall_timeout and asks the rank for its NCCL flight recorder dump."""
import json, os, socket, time
import torch, torch.distributed as dist

dist.init_process_group(
    "nccl", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=0, world_size=1
)
events = socket.socket(socket.AF_UNIX)
events.connect(os.environ["ORCHESTRATE_EVENTS"])
t = torch.ones(1 << 20, device="cuda")
for step in (1, 2, 3):
    dist.all_reduce(t)
    torch.cuda.synchronize()
    events.sendall((json.dumps({"v": 1, "event": "progress", "step": step}) + "\n").encode())
time.sleep(3600)
