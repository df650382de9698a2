#!/usr/bin/env python3
"""Writes the generated benchmark plans into the directory given as argv[1]:
reclaim.toml (10 holders each of 1, 8 and 64 GiB, one after another) and
handoff.toml (20 one-after-another 1 GiB holders)."""
import os, sys

out = sys.argv[1]
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

with open(os.path.join(out, "reclaim.toml"), "w") as f:
    f.write(chain("reclaim", [1] * 10 + [8] * 10 + [64] * 10))
with open(os.path.join(out, "handoff.toml"), "w") as f:
    f.write(chain("handoff", [1] * 20))
