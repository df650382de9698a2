#!/usr/bin/env python3
"""Whether the worker's losses are within the noise of the PyTorch peer's (issue 50).

`loss_noise.py results.json` (a `bench/llama` run of several rounds) compares, step by step,
the worker's losses with each peer run's, and sets beside them what separates two runs of the
peer itself from the same weights and batches (`torch.compile`'s kernels are not
deterministic): the |difference| at each step, its maximum and mean over the steps, for every
pair. The worker's difference is within noise when it is of the size of the peer's own.
"""
import itertools
import json
import statistics
import sys


def compare(a, b):
    k = min(len(a), len(b))
    d = [abs(x - y) for x, y in zip(a[:k], b[:k])]
    return max(d), statistics.mean(d)


def main(path):
    runs = json.load(open(path))["runs"]
    worker = [r["losses"] for r in runs if r["who"] == "stage-worker" and r["rc"] == 0]
    peer = [r["losses"] for r in runs if r["who"] != "stage-worker" and r["rc"] == 0]
    if len(peer) < 2 or not worker:
        sys.exit("needs one worker run and two peer runs")
    print("| pair | max over the steps | mean over the steps |")
    print("|---|---|---|")
    pairs = [(f"peer {i + 1} - peer {j + 1}", compare(peer[i], peer[j]))
             for i, j in itertools.combinations(range(len(peer)), 2)]
    pairs += [(f"worker 1 - peer {j + 1}", compare(worker[0], p)) for j, p in enumerate(peer)]
    pairs += [(f"worker 1 - worker {i + 1}", compare(worker[0], w))
              for i, w in enumerate(worker) if i]
    for name, (top, mean) in pairs:
        print(f"| {name} | {top:.4f} | {mean:.4f} |")
    last = lambda v: statistics.mean(v[-10:])  # noqa: E731
    print("\nmean of the last 10 steps: worker runs "
          + ", ".join(f"{last(w):.4f}" for w in worker)
          + "; peer runs " + ", ".join(f"{last(p):.4f}" for p in peer))


if __name__ == "__main__":
    main(sys.argv[1])
