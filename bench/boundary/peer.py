#!/usr/bin/env python3
"""The Python peers of the boundary benchmark: the same training stage as stage-worker's
built-in `train` (byte-level decoder-only transformer, AdamW, bf16 autocast, SDPA), written the
way a careful PyTorch user would: model built directly on the device, fused AdamW, checkpoints
with safetensors' save_file (model, and optimizer moments + step) followed by fsync.

  peer.py stage --out DIR [--init DIR] SHAPE...   one stage in this (fresh) process
  peer.py chain --root DIR --stages N SHAPE...     N chained stages in this one process

Each stage prints one JSON line of Unix-time milestones: t_main (the script began, before
`import torch`), t_import, t_device_ready (first CUDA result), t_model_ready (built, init
loaded), t_first_step, t_last_step (device synchronised), t_checkpoint_durable (files written
and fsynced), t_end (after clean-up, in the chain).
"""
import time

T_MAIN = time.time()
import argparse, gc, json, os, sys  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

T_IMPORT = time.time()

# The model is bench/gpu/bytelm.py's (also the one-process peer's).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu"))
from bytelm import ByteLM  # noqa: E402

try:
    from safetensors.torch import load_file, save_file

    SAVER = "safetensors.save_file"
except ImportError:  # a machine without safetensors: the same file format, written here
    SAVER = "hand-written safetensors"

    def save_file(tensors, path):
        header, offset, blobs = {}, 0, []
        for name, t in tensors.items():
            t = t.detach().contiguous().cpu()
            b = bytes(t.untyped_storage())[t.storage_offset() * t.element_size() :][: t.numel() * t.element_size()]
            dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
            header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
            offset += len(b)
            blobs.append(b)
        h = json.dumps(header).encode()
        h += b" " * (-(8 + len(h)) % 8)
        with open(path, "wb") as f:
            f.write(len(h).to_bytes(8, "little"))
            f.write(h)
            for b in blobs:
                f.write(b)

    def load_file(path, device="cpu"):
        with open(path, "rb") as f:
            raw = f.read()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        base, out = 8 + n, {}
        kinds = {"F32": torch.float32, "I64": torch.int64}
        for name, e in header.items():
            s, t = e["data_offsets"]
            buf = bytearray(raw[base + s : base + t])
            out[name] = torch.frombuffer(buf, dtype=kinds[e["dtype"]]).reshape(e["shape"]).to(device)
        return out


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_stage(a, out, init, marks):
    dev = torch.device(a.device)
    torch.zeros(1, device=dev).sum().item()
    marks["t_device_ready"] = time.time()
    with dev:
        model = ByteLM(a.d_model, a.layers, a.heads, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.01, fused=dev.type == "cuda")
    if init:
        model.load_state_dict(load_file(os.path.join(init, "model.safetensors"), device=str(dev)))
    marks["t_model_ready"] = time.time()
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    amp = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda")
    for step in range(a.steps):
        ids = torch.randint(0, 256, (a.batch, a.seq + 1), device=dev, generator=gen)
        with amp:
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == 0:
            loss.item()
            marks["t_first_step"] = time.time()
    loss.item()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    marks["t_last_step"] = time.time()
    os.makedirs(out, exist_ok=True)
    names = {p: n for n, p in model.named_parameters()}
    moments = {"step": torch.tensor([a.steps], dtype=torch.int64)}
    for p, st in opt.state.items():
        moments["exp_avg." + names[p]] = st["exp_avg"]
        moments["exp_avg_sq." + names[p]] = st["exp_avg_sq"]
    for name, tensors in (("model.safetensors", model.state_dict()), ("optimizer.safetensors", moments)):
        path = os.path.join(out, name)
        save_file({k: v.contiguous() for k, v in tensors.items()}, path)
        fsync_path(path)
    fsync_path(out)
    marks["t_checkpoint_durable"] = time.time()
    marks["final_loss"] = loss.item()
    return model, opt


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["stage", "chain"])
    p.add_argument("--out")
    p.add_argument("--init")
    p.add_argument("--root")
    p.add_argument("--stages", type=int, default=5)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    if a.mode == "stage":
        marks = {"t_main": T_MAIN, "t_import": T_IMPORT, "saver": SAVER}
        run_stage(a, a.out, a.init, marks)
        print(json.dumps(marks), flush=True)
        return
    prev = None
    for k in range(a.stages):
        marks = {"t_start": time.time(), "saver": SAVER}
        out = os.path.join(a.root, f"stage-{k + 1}")
        model, opt = run_stage(a, out, prev, marks)
        # The usual clean-up between stages in one process.
        del model, opt
        gc.collect()
        if a.device == "cuda":
            torch.cuda.empty_cache()
        marks["t_end"] = time.time()
        print(json.dumps(marks), flush=True)
        prev = out


if __name__ == "__main__":
    sys.exit(main())
