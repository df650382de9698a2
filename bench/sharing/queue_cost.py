"""What one hardware work queue (`CUDA_DEVICE_MAX_CONNECTIONS=1`, which orchestrate gives a
stage that shares a GPU) costs a stage's own work, against the driver's default (8).

Run as `python3 queue_cost.py ROUNDS`: for each round it starts one child per setting
(alternating which goes first), each child timing, after a warm-up:
- `train`: 300 steps of a small MLP (batch 256, 1024 wide, AdamW) on one stream: what the
  small stages that share a GPU do;
- `two_streams`: two streams, each a chain of 200 small matmuls (256 x 256), issued one
  kernel at a time on alternate streams: work that relies on two streams overlapping, where
  one queue may order kernels of different streams behind each other.
Prints one JSON object: per setting and workload, the median, min and max of the rounds'
milliseconds."""
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import json, time, torch
dev = "cuda"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(256, 1024, device=dev)
def train(steps):
    for _ in range(steps):
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
streams = [torch.cuda.Stream(), torch.cuda.Stream()]
mats = [torch.randn(256, 256, device=dev) for _ in range(2)]
def two_streams(n):
    outs = [m.clone() for m in mats]
    for i in range(n):
        for s, (o, m) in enumerate(zip(outs, mats)):
            with torch.cuda.stream(streams[s]):
                o.copy_(torch.tanh(o @ m))
    torch.cuda.synchronize()
train(20); two_streams(20)
t = time.perf_counter(); train(300); t_train = time.perf_counter() - t
t = time.perf_counter(); two_streams(200); t_two = time.perf_counter() - t
print(json.dumps({"train": t_train * 1e3, "two_streams": t_two * 1e3}))
"""


def child(connections):
    env = dict(os.environ)
    env.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if connections is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = str(connections)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    settings = {"default": None, "one_queue": 1}
    seen = {name: {"train": [], "two_streams": []} for name in settings}
    for r in range(rounds):
        order = list(settings.items())
        if r % 2:
            order.reverse()
        for name, connections in order:
            for work, ms in child(connections).items():
                seen[name][work].append(ms)
    spread = lambda v: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
    print(json.dumps({name: {w: spread(v) for w, v in works.items()} for name, works in seen.items()},
                     indent=1))


if __name__ == "__main__":
    main()
