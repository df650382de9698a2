#!/usr/bin/env python3
"""The Llama `train` stage's final checkpoint on the CPU: `checkpoint_write_s` of a ~133M
Llama (width 1024, 12 layers, 16 query and 4 key-value heads; 0.53 GB of weights, 1.6 GB of
checkpoint with the optimizer's moments), one step of 1x16 tokens, RUNS times per binary and
per output location, interleaved.

    bench/llama/cpu_checkpoint.py --bin NAME=PATH [--bin NAME=PATH ...] \
        --where shm=/dev/shm/llama-ckpt --where disk=/tmp/llama-ckpt \
        [--runs 3] [--python .venv-frameworks/bin/python] [--model DIR] [--out results.json]

The model is made once with configs/llama/make_tiny_llama.py (transformers, random init) in
--model (default: a folder under the first --where) unless it is there. Each run starts from
an empty output directory (so nothing is resumed or reported again) and reads the stage's
`metrics` event from stdout. Prints one line per run and a summary (median, min, max) per
binary and location; --out writes all of it as JSON.
"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = ["cat", "dog", "red", "fox", "runs", "sees", "small", "green", "bird"]


def corpus(path):
    with open(path, "w") as f:
        for i in range(400):
            phrase = " ".join(WORDS[(i * 7 + j * 5) % len(WORDS)] for j in range(2 + i % 4))
            f.write(json.dumps({"text": f"the {phrase} and the {phrase}."}) + "\n")


def make_model(python, model, text):
    if os.path.isfile(os.path.join(model, "model.safetensors")):
        return
    subprocess.run([python, os.path.join(ROOT, "configs/llama/make_tiny_llama.py"),
                    "--out", model, "--corpus", text, "--hidden", "1024", "--layers", "12",
                    "--heads", "16", "--kv-heads", "4", "--vocab", "512"],
                   check=True, env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))


def run_once(binary, model, text, where, name):
    out = os.path.join(where, f"out-{name}")
    shutil.rmtree(out, ignore_errors=True)
    spec = {"v": 1, "stage": "ckpt", "kind": "train", "device": "cpu", "attempt": 1,
            "params": {"data": text, "steps": 1, "batch_size": 1, "seq_len": 16, "lr": 1e-4,
                       "warmup_steps": 0, "seed": 1},
            "output_dir": out, "inputs": {}, "init": model}
    spec_path = os.path.join(where, f"spec-{name}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ)
    env.pop("ORCHESTRATE_EVENTS", None)
    started = time.time()
    p = subprocess.run([binary, "--spec", spec_path], capture_output=True, text=True, env=env)
    wall = time.time() - started
    if p.returncode != 0:
        sys.exit(f"{binary} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    events = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    metrics = next(e["metrics"] for e in events if e.get("event") == "metrics")
    size = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    shutil.rmtree(out, ignore_errors=True)
    return {"checkpoint_write_s": metrics["checkpoint_write_s"], "wall_s": wall,
            "parameters": metrics["parameters"], "bytes": size,
            "released": any(e.get("event") == "released" for e in events)}


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--bin", action="append", required=True, help="NAME=PATH")
    a.add_argument("--where", action="append", required=True, help="NAME=DIR")
    a.add_argument("--runs", type=int, default=3)
    a.add_argument("--python", default=os.path.join(ROOT, ".venv-frameworks/bin/python"))
    a.add_argument("--model")
    a.add_argument("--out")
    args = a.parse_args()
    bins = [b.split("=", 1) for b in args.bin]
    wheres = [w.split("=", 1) for w in args.where]
    for _, d in wheres:
        os.makedirs(d, exist_ok=True)
    text = os.path.join(wheres[0][1], "corpus.jsonl")
    corpus(text)
    model = args.model or os.path.join(wheres[0][1], "model-133m")
    make_model(args.python, model, text)
    runs = []
    for i in range(args.runs):
        for bname, binary in bins:
            for wname, d in wheres:
                r = run_once(binary, model, text, d, bname)
                r.update(bin=bname, where=wname, run=i + 1)
                print(json.dumps(r), flush=True)
                runs.append(r)
    summary = []
    for bname, _ in bins:
        for wname, _ in wheres:
            xs = [r["checkpoint_write_s"] for r in runs if r["bin"] == bname and r["where"] == wname]
            summary.append({"bin": bname, "where": wname, "median": statistics.median(xs),
                            "min": min(xs), "max": max(xs), "runs": len(xs)})
            print(f"{bname:>8} {wname:>5}: checkpoint_write_s median {statistics.median(xs):.2f} "
                  f"(range {min(xs):.2f}-{max(xs):.2f}, {len(xs)} runs)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": platform.node(), "cpus": os.cpu_count(),
                       "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "bins": dict(bins), "where": dict(wheres), "runs": runs,
                       "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
