"""Pieces of the GPU benchmark's generated plans, shared by make_plans.py and multi_gpu.sh:
the dataset samples of seed 001's loop and the sweep plan over them."""
import json, os, random

WORDS = "cat dog frog bird fish duck goat lamb red blue green old small big sees likes finds".split()
MODEL = "{ d_model = 512, n_layers = 4, n_heads = 8, max_seq_len = 128 }"


def write_samples(out, n):
    """n dataset samples (400 upper-casing examples each, seeded by their number) in out/samples/."""
    os.makedirs(os.path.join(out, "samples"), exist_ok=True)
    for k in range(n):
        rng = random.Random(1000 + k)
        with open(os.path.join(out, "samples", f"sample-{k:02d}.jsonl"), "w") as f:
            for _ in range(400):
                ws = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))
                f.write(json.dumps({"prompt": f"upper: {ws}\n", "completion": ws.upper() + "\n"}) + "\n")


def sweep_plan(name, glob="samples/*.jsonl", max_parallel=None, gpus=False):
    """Seed 001's loop as a plan: a base model, then one fine-tune and one eval per sample
    matching glob; with gpus, every stage asks for one GPU."""
    run = f'[run]\nname = "{name}"\n' + (f"max_parallel = {max_parallel}\n" if max_parallel else "")
    gpu = "gpus = 1\n" if gpus else ""
    return f"""{run}
[[stage]]
name = "base"
kind = "train"
{gpu}[stage.params]
data = "synthetic:pretrain"
steps = 100
batch_size = 32
seq_len = 128
lr = 1e-3
model = {MODEL}

[[stage]]
name = "finetune"
kind = "train"
{gpu}after = ["base"]
init = "base"
matrix = {{ sample = {{ glob = "{glob}" }} }}
[stage.params]
data = "{{matrix.sample}}"
steps = 50
batch_size = 32
seq_len = 128
lr = 1e-3

[[stage]]
name = "eval"
kind = "eval"
{gpu}after = ["finetune"]
init = "finetune"
matrix = {{ sample = {{ glob = "{glob}" }} }}
[stage.params]
data = "synthetic:sft"
samples = 100
seq_len = 128
"""
