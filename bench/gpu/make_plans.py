#!/usr/bin/env python3
"""Writes the generated benchmark plans into the directory given as argv[1]:
reclaim.toml (10 holders each of 1, 8 and 64 GiB, one after another),
handoff.toml (20 one-after-another 1 GiB holders) and
sweep20.toml with samples/ (seed 001's loop: 20 fine-tune + eval instances of a matrix)."""
import json, os, random, sys

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

# Seed 001's loop: one fine-tune and one eval per dataset sample, 20 samples.
words = "cat dog frog bird fish duck goat lamb red blue green old small big sees likes finds".split()
os.makedirs(os.path.join(out, "samples"), exist_ok=True)
for k in range(20):
    rng = random.Random(1000 + k)
    with open(os.path.join(out, "samples", f"sample-{k:02d}.jsonl"), "w") as f:
        for _ in range(400):
            ws = " ".join(rng.choice(words) for _ in range(rng.randint(1, 4)))
            f.write(json.dumps({"prompt": f"upper: {ws}\n", "completion": ws.upper() + "\n"}) + "\n")
model = "{ d_model = 512, n_layers = 4, n_heads = 8, max_seq_len = 128 }"
with open(os.path.join(out, "sweep20.toml"), "w") as f:
    f.write(f"""[run]
name = "sweep20"

[[stage]]
name = "base"
kind = "train"
[stage.params]
data = "synthetic:pretrain"
steps = 100
batch_size = 32
seq_len = 128
lr = 1e-3
model = {model}

[[stage]]
name = "finetune"
kind = "train"
after = ["base"]
init = "base"
matrix = {{ sample = {{ glob = "samples/*.jsonl" }} }}
[stage.params]
data = "{{matrix.sample}}"
steps = 50
batch_size = 32
seq_len = 128
lr = 1e-3

[[stage]]
name = "eval"
kind = "eval"
after = ["finetune"]
init = "finetune"
matrix = {{ sample = {{ glob = "samples/*.jsonl" }} }}
[stage.params]
data = "synthetic:sft"
samples = 100
seq_len = 128
""")
