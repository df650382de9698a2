#!/usr/bin/env python3
"""Writes the generated benchmark plans into the directory given as argv[1]:
reclaim.toml (HOLDERS holders each of 1, 8 and 64 GiB, one after another; these stages write
no checkpoint, and the same run gives the reclaim and the no-checkpoint handoff figures) and
sweep.toml with samples/ (seed 001's loop: SAMPLES fine-tune + eval instances of a matrix).

    make_plans.py DIR [--holders N (default 3)] [--samples N (default 2)]"""
import argparse, os

from benchplans import sweep_plan, write_samples

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--holders", type=int, default=3)
ap.add_argument("--samples", type=int, default=2)
args = ap.parse_args()
out = args.out
os.makedirs(out, exist_ok=True)

def chain(name, sizes):
    lines = [f'[run]\nname = "{name}"\n']
    prev = None
    for i, gib in enumerate(sizes):
        stage = f"hold-{gib}gib-{i:02d}"
        lines.append("[[stage]]")
        lines.append(f'name = "{stage}"')
        lines.append("gpus = 1")
        if prev:
            lines.append(f'after = ["{prev}"]')
        lines.append(f'command = ["stage-worker", "hold", "--gib", "{gib}"]\n')
        prev = stage
    return "\n".join(lines)

h = args.holders
with open(os.path.join(out, "reclaim.toml"), "w") as f:
    f.write(chain("reclaim", [1] * h + [8] * h + [64] * h))

# Seed 001's loop: one fine-tune and one eval per dataset sample, SAMPLES samples.
write_samples(out, args.samples)
with open(os.path.join(out, "sweep.toml"), "w") as f:
    f.write(sweep_plan("sweep"))
