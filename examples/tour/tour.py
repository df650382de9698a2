"""The tour's one stage script: `pretrain`, `finetune SAMPLE BASE_DIR`, `evaluate SAMPLE MODEL_DIR`.

A logistic-regression classifier of 2-D points: pretrained on points of every sample, then
fine-tuned on one sample's points (each sample is the same task turned by its own angle) and
evaluated on held-out points of that sample. Weights travel between stages as model.json.
The arithmetic runs on torch when it is installed (on the GPU when there is one), else in
plain Python: the same script runs with nothing but the standard library and orchestrate.
"""
import json
import math
import os
import random
import sys
import time
from pathlib import Path

try:
    import orchestrate_stage as stage
except ImportError:  # run from a clone without installing: the package is in python/
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import orchestrate_stage as stage


def load_torch():
    """torch when it is installed (one thread: the samples' stages share the cores), else None."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    return torch

torch = None
ANGLES = {"a": 0.3, "b": 0.9, "c": 1.5}
STEPS = {"pretrain": 2000, "finetune": 1500}


def points(sample, n, seed):
    """n labelled points of `sample`: the label says which side of a turned line a point is."""
    rng = random.Random(seed)
    angle = ANGLES[sample]
    normal = (math.cos(angle), math.sin(angle))
    xs, ys = [], []
    for _ in range(n):
        x = (rng.uniform(-1, 1), rng.uniform(-1, 1))
        xs.append(x)
        ys.append(1.0 if x[0] * normal[0] + x[1] * normal[1] + 0.1 > 0 else 0.0)
    return xs, ys


def train_python(w, xs, ys, steps, lr):
    """Full-batch gradient descent on the logistic loss; returns the weights and the last loss."""
    w = list(w)
    loss = 0.0
    for step in range(steps):
        grad = [0.0, 0.0, 0.0]
        loss = 0.0
        for (a, b), y in zip(xs, ys):
            p = 1 / (1 + math.exp(-(w[0] * a + w[1] * b + w[2])))
            loss -= y * math.log(p + 1e-9) + (1 - y) * math.log(1 - p + 1e-9)
            for i, v in enumerate((a, b, 1.0)):
                grad[i] += (p - y) * v
        w = [wi - lr * g / len(xs) for wi, g in zip(w, grad)]
        loss /= len(xs)
        if (step + 1) % 250 == 0:
            stage.progress(step + 1, total_steps=steps, loss=loss)
    return w, loss


def train_torch(w, xs, ys, steps, lr, device):
    """The same descent with torch tensors on `device`."""
    x = torch.tensor([[a, b, 1.0] for a, b in xs], device=device)
    y = torch.tensor(ys, device=device)
    wt = torch.tensor(w, device=device, requires_grad=True)
    loss = None
    for step in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(x @ wt, y)
        (g,) = torch.autograd.grad(loss, wt)
        with torch.no_grad():
            wt -= lr * g
        if (step + 1) % 250 == 0:
            stage.progress(step + 1, total_steps=steps, loss=loss.item())
    return wt.detach().cpu().tolist(), loss.item()


def accuracy(w, xs, ys):
    right = sum((w[0] * a + w[1] * b + w[2] > 0) == (y > 0.5) for (a, b), y in zip(xs, ys))
    return right / len(xs)


def main():
    phase = sys.argv[1]
    sample = sys.argv[2] if len(sys.argv) > 2 else None
    upstream = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    global torch
    # Evaluating needs no torch (importing it alone takes seconds on a small CPU).
    torch = load_torch() if phase != "evaluate" else None
    device = "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    backend = "torch" if torch is not None else "python"
    stage.started(device=device)
    out = stage.output_dir()
    t0 = time.time()
    if phase == "evaluate":
        w = json.loads((upstream / "model.json").read_text())["w"]
        xs, ys = points(sample, 2000, seed=1000 + ord(sample))
        acc = accuracy(w, xs, ys)
        print(f"sample {sample}: accuracy {acc:.3f} on {len(xs)} held-out points")
        stage.metrics(accuracy=acc)
        return
    if phase == "pretrain":
        xs, ys = [], []
        for s in ANGLES:
            more = points(s, 200, seed=ord(s))
            xs += more[0]
            ys += more[1]
        w = [0.0, 0.0, 0.0]
    else:
        xs, ys = points(sample, 300, seed=ord(sample))
        w = json.loads((upstream / "model.json").read_text())["w"]
    if torch is not None:
        w, loss = train_torch(w, xs, ys, STEPS[phase], 2.0, device)
    else:
        w, loss = train_python(w, xs, ys, STEPS[phase], 2.0)
    tmp = out / "model.json.tmp"
    tmp.write_text(json.dumps({"w": w, "backend": backend}))
    os.replace(tmp, out / "model.json")
    stage.checkpoint(out / "model.json", step=STEPS[phase])
    stage.metrics(loss=loss, train_accuracy=accuracy(w, xs, ys), train_s=time.time() - t0)
    print(f"{phase} {sample or ''}: loss {loss:.3f} after {STEPS[phase]} steps ({backend}, {device})")


if __name__ == "__main__":
    main()
