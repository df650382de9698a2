#!/usr/bin/env python3
"""The throughput benchmark's driver (see run.sh and README.md): stage-worker's built-in
`train` stage against PyTorch eager and torch.compile of the same model and step, at 100M
and 1B parameters, every variant REPEATS times, interleaved, in one go on one GPU.

  bench.py BIN_DIR OUT_DIR WORK_DIR

Environment: SHAPES (default "m100 m1b"), REPEATS (3), WORKER_VARIANTS (space-separated;
"default" is the worker as built, "NAME=VALUE[,NAME=VALUE]" sets STAGE_WORKER_NAME=VALUE; "WORKER=PATH" runs that binary instead),
PEERS ("eager compile"), PROFILE=1 adds one profiled run of each worker variant and peer at
the first shape (traces in OUT_DIR/profiles, summarised by profile_summary.py), or of those
PROFILE_VARIANTS and PROFILE_PEERS name.
"""
import json, os, subprocess, sys, time

BIN, OUT, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
ORCH, WORKER = os.path.join(BIN, "orchestrate"), os.path.join(BIN, "stage-worker")
TINY = os.environ.get("BENCH_TINY") == "1"  # a CPU rehearsal of the whole script
SHAPES = {
    # name: (d_model, layers, heads, batch, seq, steps)
    "m100": (1024, 8, 16, 32, 256, 300),
    "m1b": (2048, 20, 16, 32, 256, 40),
}
if TINY:
    SHAPES = {"m100": (64, 1, 2, 2, 32, 8), "m1b": (96, 2, 2, 2, 32, 8)}
WANTED = os.environ.get("SHAPES", "m100 m1b").split()
REPEATS = int(os.environ.get("REPEATS", "3"))
VARIANTS = os.environ.get("WORKER_VARIANTS", "default").split()
PEERS = os.environ.get("PEERS", "eager compile").split()
PROFILE = os.environ.get("PROFILE") == "1"
PROFILE_VARIANTS = os.environ.get("PROFILE_VARIANTS", " ".join(VARIANTS)).split()
PROFILE_PEERS = os.environ.get("PROFILE_PEERS", " ".join(PEERS)).split()
RESULTS = {"shapes": {k: SHAPES[k] for k in WANTED}, "runs": []}


def log(msg):
    print(f"== {time.strftime('%H:%M:%S')} {msg}", flush=True)


def save():
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def variant_settings(variant):
    """A variant's settings: `default`, or `KEY=VALUE,...` where each KEY becomes the worker's
    `STAGE_WORKER_KEY` variable, except `WORKER=PATH`, which runs another stage-worker binary
    (an A/B of two builds in one call)."""
    if variant == "default":
        return {}
    return dict(kv.split("=", 1) for kv in variant.split(","))


def variant_env(variant):
    return {f"STAGE_WORKER_{k}": v for k, v in variant_settings(variant).items() if k != "WORKER"}


def run_worker(shape_name, variant, profile=None):
    d, layers, heads, batch, seq, steps = SHAPES[shape_name]
    tag = f"w-{shape_name}-{len(RESULTS['runs'])}"
    plan = os.path.join(WORK, f"{tag}.toml")
    with open(plan, "w") as f:
        f.write(f'[run]\nname = "{tag}"\ngpu_tolerance_mib = 64\n\n[[stage]]\nname = "train"\nkind = "train"\n'
                f'[stage.params]\ndata = "synthetic:pretrain"\nsteps = {steps}\nbatch_size = {batch}\n'
                f'seq_len = {seq}\nlr = 3e-4\nprogress_every_s = 30.0\n'
                f'model = {{ d_model = {d}, n_layers = {layers}, n_heads = {heads}, max_seq_len = {seq} }}\n')
    env = dict(os.environ, **variant_env(variant))
    if profile:
        env["STAGE_WORKER_PROFILE"] = profile
    run_dir = os.path.join(WORK, tag)
    worker = variant_settings(variant).get("WORKER", WORKER)
    p = subprocess.run([ORCH, "--plan", plan, "--run-dir", run_dir, "--worker", worker, "-q"],
                       env=env, capture_output=True, text=True, timeout=500)
    row = {"who": "stage-worker", "variant": variant, "shape": shape_name, "rc": p.returncode,
           "profiled": bool(profile)}
    try:
        stage = json.load(open(os.path.join(run_dir, "report.json")))["stages"][0]
        m = stage.get("metrics") or {}
        row.update({k: m.get(k) for k in ("tokens_per_s", "final_loss", "parameters", "fused_adamw")})
        t = m
        if "t_first_step" in t and "t_model_ready" in t:
            row["first_step_s"] = t["t_first_step"] - t["t_model_ready"]
        row["status"] = stage["status"]
    except (OSError, ValueError, KeyError, IndexError) as e:
        row["error"] = f"{e}: {(p.stdout + p.stderr)[-1500:]}"
    if p.returncode != 0:
        try:
            row["stderr"] = open(os.path.join(run_dir, "stages", "train", "stderr.log")).read()[-3000:]
        except OSError:
            row["stderr"] = (p.stdout + p.stderr)[-3000:]
    subprocess.run(["rm", "-rf", run_dir])
    return row


def run_peer(shape_name, mode, profile=None):
    d, layers, heads, batch, seq, steps = SHAPES[shape_name]
    cmd = [sys.executable, os.path.join(HERE, "peer.py"), "--mode", mode, "--d-model", str(d),
           "--layers", str(layers), "--heads", str(heads), "--batch", str(batch), "--seq", str(seq),
           "--steps", str(steps), "--skip", "2" if TINY else "5"]
    if profile:
        cmd += ["--profile", profile]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    row = {"who": "pytorch-" + mode, "variant": mode, "shape": shape_name, "rc": p.returncode,
           "profiled": bool(profile)}
    try:
        row.update(json.loads(p.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        row["error"] = p.stderr[-3000:]
    return row


def main():
    os.makedirs(WORK, exist_ok=True)
    if PROFILE:
        pdir = os.path.join(OUT, "profiles")
        os.makedirs(pdir, exist_ok=True)
        shape = WANTED[0]
        for v in PROFILE_VARIANTS:
            name = v.replace("=", "-").replace(",", "_")
            row = run_worker(shape, v, profile=os.path.join(pdir, f"worker-{name}.json"))
            log(f"profiled worker {v}: {row.get('tokens_per_s')}")
            RESULTS["runs"].append(row)
        for mode in PROFILE_PEERS:
            row = run_peer(shape, mode, profile=os.path.join(pdir, f"{mode}.json"))
            log(f"profiled {mode}: {row.get('tokens_per_s')}")
            RESULTS["runs"].append(row)
        save()
    for shape in WANTED:
        for r in range(REPEATS):
            for v in VARIANTS:
                row = run_worker(shape, v)
                row["repeat"] = r
                RESULTS["runs"].append(row)
                log(f"{shape} worker {v} #{r}: {row.get('tokens_per_s')} {row.get('error', '')[:300]}")
                save()
            for mode in PEERS:
                row = run_peer(shape, mode)
                row["repeat"] = r
                RESULTS["runs"].append(row)
                log(f"{shape} {mode} #{r}: {row.get('tokens_per_s')} {row.get('error', '')[:300]}")
                save()
    save()


if __name__ == "__main__":
    main()
