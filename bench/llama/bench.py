#!/usr/bin/env python3
"""bench/llama's driver (see gpu.sh): stage-worker's built-in `train` stage on a Llama model
against torch.compile of transformers' LlamaForCausalLM with the same step, the same initial
weights and the same batches, ROUNDS times each, interleaved, in one process tree on one GPU.

  bench.py BIN_DIR OUT_DIR WORK_DIR

Environment: SHAPE ("1b"), ROUNDS (3), STEPS (100), BATCH (32), SEQ (256: the throughput
benchmark's batch and sequence), PEER_MODE ("compile"), BENCH_TINY=1 (a CPU rehearsal: the
tiny shape, fp32, eager, few steps; it checks that both sides start from the same loss).
PROFILE=1 first adds one short profiled run of each side (PROFILE_SKIP (5) steps of warm-up,
then PROFILE_STEPS (3) recorded: the worker's STAGE_WORKER_PROFILE, the peer's torch.profiler),
Chrome traces in OUT_DIR/profiles/ that gpu.sh summarises into OUT_DIR/profiles.md; those runs'
throughput is not reported.
"""
import json, os, statistics, subprocess, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SHAPES, make_model_dir  # noqa: E402

BIN, OUT, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
TINY = os.environ.get("BENCH_TINY") == "1"
SHAPE = "tiny" if TINY else os.environ.get("SHAPE", "1b")
ROUNDS = int(os.environ.get("ROUNDS", "2" if TINY else "3"))
STEPS = int(os.environ.get("STEPS", "20" if TINY else "100"))
BATCH = int(os.environ.get("BATCH", "4" if TINY else "32"))
SEQ = int(os.environ.get("SEQ", "32" if TINY else "256"))
MODE = os.environ.get("PEER_MODE", "eager" if TINY else "compile")
LR, WARMUP, WD, SEED, SKIP = 3e-4, 10, 0.01, 1, 5
CUDA = not TINY
PROFILE = os.environ.get("PROFILE") == "1"
PROFILE_SKIP = int(os.environ.get("PROFILE_SKIP", "5"))
PROFILE_STEPS = int(os.environ.get("PROFILE_STEPS", "3"))


def log(msg):
    print(f"== {time.strftime('%H:%M:%S')} {msg}", flush=True)


def run_worker(model, data, tag, profile=None):
    out_dir = os.path.join(WORK, tag)
    steps = PROFILE_SKIP + PROFILE_STEPS if profile else STEPS
    spec = {"v": 1, "stage": tag, "kind": "train", "output_dir": out_dir, "inputs": {},
            "init": model, "device": "cuda" if CUDA else "cpu", "attempt": 1,
            "params": {"data": data, "steps": steps, "batch_size": BATCH, "seq_len": SEQ,
                       "lr": LR, "warmup_steps": WARMUP, "weight_decay": WD, "seed": SEED,
                       "progress_every_s": 30.0}}
    spec_path = os.path.join(WORK, f"{tag}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    loss_log = os.path.join(WORK, f"{tag}-losses.json")
    env = dict(os.environ, STAGE_WORKER_LOSS_LOG=loss_log)
    if profile:
        env.update(STAGE_WORKER_PROFILE=profile, STAGE_WORKER_PROFILE_SKIP=str(PROFILE_SKIP),
                   STAGE_WORKER_PROFILE_STEPS=str(PROFILE_STEPS))
        if CUDA and not os.environ.get("STAGE_WORKER_SDPA"):
            # The profiled stage plans a few steps, for which `auto` would pick other attention
            # kernels than for the measured runs (libtorch's own, cuDNN, at the 1B shape).
            # As stage-worker's attention_steps: layers x heads x head size x batch x seq^2
            # against the 100M model's, for which cuDNN pays from 200 steps.
            c = SHAPES[SHAPE]
            work = (c["num_hidden_layers"] * c["hidden_size"] * BATCH * SEQ * SEQ
                    / (8 * 16 * 64 * 32 * 256 * 256))
            env["STAGE_WORKER_SDPA"] = "libtorch" if STEPS * work >= 200 else "auto"
    env.pop("ORCHESTRATE_EVENTS", None)
    t0 = time.time()
    p = subprocess.run([os.path.join(BIN, "stage-worker"), "--spec", spec_path], env=env,
                       capture_output=True, text=True, timeout=900)
    wall = time.time() - t0
    with open(os.path.join(OUT, f"{tag}.stderr.txt"), "w") as f:
        f.write(p.stderr)
    metrics = {}
    for line in p.stdout.splitlines():
        e = json.loads(line)
        if e.get("event") == "metrics":
            metrics = e["metrics"]
    losses = json.load(open(loss_log))["losses"] if os.path.exists(loss_log) else []
    subprocess.run(["rm", "-rf", out_dir])
    # The final checkpoint: its write, and when the device was given back and the files were
    # durable, after the last step (no release on the CPU).
    last = metrics.get("t_last_step")
    after_last = {f"{k[2:]}_after_last_step_s": metrics[k] - last
                  for k in ("t_device_released", "t_checkpoint_durable")
                  if last is not None and k in metrics}
    return {"who": "stage-worker", "rc": p.returncode, "wall_s": wall,
            "tokens_per_s": metrics.get("tokens_per_s"), "losses": losses,
            "parameters": metrics.get("parameters"),
            "checkpoint_write_s": metrics.get("checkpoint_write_s"),
            "pinned_buffers": metrics.get("pinned_buffers"), **after_last}


def run_peer(model, data, tag, profile=None):
    result = os.path.join(WORK, f"{tag}.json")
    steps, skip = (PROFILE_SKIP + PROFILE_STEPS, PROFILE_SKIP) if profile else (STEPS, SKIP)
    args = [sys.executable, os.path.join(HERE, "peer.py"), "--model", model, "--data", data,
            "--mode", MODE, "--steps", str(steps), "--batch", str(BATCH), "--seq", str(SEQ),
            "--lr", str(LR), "--warmup", str(WARMUP), "--weight-decay", str(WD),
            "--seed", str(SEED), "--skip", str(skip), "--out", result]
    if profile:
        args += ["--profile", profile, "--profile-steps", str(PROFILE_STEPS)]
    t0 = time.time()
    p = subprocess.run(args, capture_output=True, text=True, timeout=900)
    wall = time.time() - t0
    with open(os.path.join(OUT, f"{tag}.stderr.txt"), "w") as f:
        f.write(p.stderr)
    row = {"who": f"torch-{MODE}", "rc": p.returncode, "wall_s": wall}
    if p.returncode == 0:
        row.update(json.load(open(result)))
    return row


def profile_both(model, data):
    """One short profiled run of each side, traces in OUT/profiles/ (not in results.json)."""
    pdir = os.path.join(OUT, "profiles")
    os.makedirs(pdir, exist_ok=True)
    for who, run in (("worker", run_worker), (f"torch-{MODE}", run_peer)):
        trace = os.path.join(pdir, f"{who}.json")
        row = run(model, data, f"profile-{who}", profile=trace)
        log(f"profiled {who}: rc {row['rc']}, trace {'saved' if os.path.exists(trace) else 'MISSING'}")
        if row["rc"] != 0 or not os.path.exists(trace):
            raise SystemExit(f"the profiled {who} run failed (see OUT/profile-{who}.stderr.txt)")


def spread(values):
    values = [v for v in values if v]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def main():
    os.makedirs(WORK, exist_ok=True)
    model, data = os.path.join(WORK, "model"), os.path.join(WORK, "data.jsonl")
    log(f"making the {SHAPE} model, its tokenizer and data")
    n = make_model_dir(SHAPE, model, data, "cuda" if CUDA else "cpu",
                       tokens=50_000 if TINY else 1_000_000)
    log(f"{n} parameters; {ROUNDS} rounds of {STEPS} steps of {BATCH}x{SEQ}, peer: {MODE}")
    if PROFILE:
        profile_both(model, data)
    runs = []
    for r in range(1, ROUNDS + 1):
        for who in ("worker", "peer"):
            tag = f"{who}-{r}"
            row = (run_worker if who == "worker" else run_peer)(model, data, tag)
            row["round"] = r
            runs.append(row)
            log(f"{tag}: rc {row['rc']}, {row.get('tokens_per_s') or 0:.0f} tokens/s, "
                f"wall {row['wall_s']:.1f} s")
            with open(os.path.join(OUT, "results.json"), "w") as f:
                json.dump({"shape": SHAPE, "steps": STEPS, "batch": BATCH, "seq": SEQ,
                           "peer_mode": MODE, "parameters": n, "runs": runs}, f, indent=1)
    summarize(runs, n)


def summarize(runs, n):
    w = [r for r in runs if r["who"] == "stage-worker" and r["rc"] == 0]
    p = [r for r in runs if r["who"] != "stage-worker" and r["rc"] == 0]
    sw, sp = spread([r["tokens_per_s"] for r in w]), spread([r["tokens_per_s"] for r in p])
    lines = [f"# bench/llama: {SHAPE} ({n} parameters), {STEPS} steps of {BATCH}x{SEQ}", "",
             "| who | runs | tokens/s median | min | max |", "|---|---|---|---|---|"]
    for name, s in (("stage-worker", sw), (f"torch.{MODE}" if MODE == "compile" else MODE, sp)):
        if s:
            lines.append(f"| {name} | {s['n']} | {s['median']:.0f} | {s['min']:.0f} | {s['max']:.0f} |")
    if sw and sp:
        lines.append(f"\nratio (medians): **{sw['median'] / sp['median']:.3f}x**")
    lines += ["", "stage-worker's final checkpoint (seconds; median, min, max):"]
    for key in ("checkpoint_write_s", "device_released_after_last_step_s",
                "checkpoint_durable_after_last_step_s"):
        s = spread([r.get(key) for r in w])
        if s:
            lines.append(f"- {key}: {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f}, {s['n']} runs)")
    if w and p and w[0]["losses"] and p[0]["losses"]:
        a, b = w[0]["losses"], p[0]["losses"]
        k = min(len(a), len(b))
        diffs = [abs(x - y) for x, y in zip(a[:k], b[:k])]
        last = lambda v: sum(v[-10:]) / len(v[-10:])  # noqa: E731
        spread_w = max(r["losses"][-1] for r in w) - min(r["losses"][-1] for r in w)
        spread_p = max(r["losses"][-1] for r in p) - min(r["losses"][-1] for r in p)
        lines += ["", "loss (round 1): step 1, 10, 50, last; mean of the last 10",
                  f"- stage-worker: {a[0]:.4f} {a[min(9, k-1)]:.4f} {a[min(49, k-1)]:.4f} {a[k-1]:.4f}; {last(a[:k]):.4f}",
                  f"- torch: {b[0]:.4f} {b[min(9, k-1)]:.4f} {b[min(49, k-1)]:.4f} {b[k-1]:.4f}; {last(b[:k]):.4f}",
                  f"- |difference|: step 1 {diffs[0]:.2e}, max over {k} steps {max(diffs):.4f}, "
                  f"mean {sum(diffs) / k:.4f}",
                  f"- run-to-run spread of the last step's loss: stage-worker {spread_w:.4f}, "
                  f"torch {spread_p:.4f}"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(OUT, "summary.md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    if TINY and w and p:
        d0 = abs(w[0]["losses"][0] - p[0]["losses"][0])
        assert d0 < 1e-4, f"the first step's losses differ by {d0}: not the same weights and batch"


if __name__ == "__main__":
    main()
