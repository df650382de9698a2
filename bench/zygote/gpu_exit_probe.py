"""Where a tiny GPU stage's exit goes, on a GPU host: a process that imported torch (and froze
its objects, as the zygote does) forks children that each make a CUDA tensor, sum it, print
the time and exit. How long from that last line to the parent reaping the child, by how the
child exits:

- "interpreter": the interpreter's own shutdown (threads joined, atexit, module teardown, C
  exit handlers: libcuda's included);
- "atexit+os._exit": threads joined and atexit handlers run as the interpreter would, then
  `os._exit` (no module teardown, no C exit handlers: the kernel closes the device files);
- "os._exit": nothing at all (the floor).

Each alone (RUNS times, alternating), and four at once (RUNS waves each), since stages that
share a GPU exit together. Prints the median and range of each. Usage: python3 gpu_exit_probe.py [RUNS]
"""
import gc
import os
import statistics
import sys
import time

import torch

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
VARIANTS = ("interpreter", "atexit+os._exit", "os._exit")


def child(variant, pipe):
    t0 = time.time()
    torch.cuda.init()
    x = torch.ones(1 << 20, device="cuda")
    float(x.sum())
    last = time.time()
    os.write(pipe, f"{t0} {last}\n".encode())
    os.close(pipe)
    if variant == "os._exit":
        os._exit(0)
    if variant == "atexit+os._exit":
        import atexit
        import threading

        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(0)  # the interpreter's shutdown


def wave(variant, count):
    """Starts `count` children at once; returns each one's (work s, last line -> reaped s)."""
    started = []
    for _ in range(count):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            child(variant, w)
        os.close(w)
        started.append((pid, r))
    seen = []
    reaped = {}
    lines = {}
    for pid, r in started:
        with os.fdopen(r) as f:
            lines[pid] = f.read().split()
    pending = {pid for pid, _ in started}
    while pending:
        pid, _ = os.wait()
        reaped[pid] = time.time()
        pending.discard(pid)
    for pid, _ in started:
        t0, last = map(float, lines[pid])
        seen.append((last - t0, reaped[pid] - last))
    return seen


def show(label, xs):
    ms = [x * 1000 for x in xs]
    print(f"  {label:28} median {statistics.median(ms):7.1f} ms  range {min(ms):7.1f}–{max(ms):7.1f} ms  n={len(ms)}")


gc.freeze()
print(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch", torch.__version__, flush=True)
for count in (1, 4):
    results = {v: [] for v in VARIANTS}
    for _ in range(RUNS):
        for variant in VARIANTS:
            results[variant] += wave(variant, count)
    print(f"{count} at once:")
    for variant, seen in results.items():
        show(f"{variant}: work", [w for w, _ in seen])
        show(f"{variant}: exit", [e for _, e in seen])
