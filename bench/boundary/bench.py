#!/usr/bin/env python3
"""The boundary benchmark's driver (see run.sh): runs every variant in one go on one machine,
then writes results.json and summary.md into OUT.

Variants, each a chain of training stages (stage k+1 starts from stage k's weights):
  orchestrate        built-in train stages under `orchestrate` (fork server on)
  orchestrate-exec   the same with ORCHESTRATE_FORK_SERVER=0 (every worker exec'd)
  python-fresh       peer.py, one fresh Python process per stage (import torch, build, train,
                     safetensors save_file + fsync)
  python-one         peer.py, every stage in one Python process (saving the same checkpoints)
Per stage: spawn → worker started → device ready → model ready → first step → last step →
checkpoint durable → verified (orchestrate) → next stage spawned; steady training time
= (last step − first step) × steps / (steps − 1); boundary overhead = stage wall − steady.
Also: cold start (spawn → first CUDA result) for fork server, exec and Python, and
`dd conv=fsync` of as many bytes as one checkpoint, on the same disk.
"""
import json, math, os, shutil, subprocess, sys, time

BIN, OUT, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "peer.py")
ORCH = os.path.join(BIN, "orchestrate")
WORKER = os.path.join(BIN, "stage-worker")
PARTS = os.environ.get("PARTS", "cold m100 dd m1b").split()
RESULTS = {"parts": PARTS}

SHAPES = {
    # name: (d_model, layers, heads, batch, seq, steps, chain length)
    "m100": (1024, 8, 16, 32, 256, 60, 5),
    "m1b": (2048, 20, 16, 32, 256, 20, int(os.environ.get("M1B_STAGES", "2"))),
}
TINY = os.environ.get("BENCH_TINY") == "1"  # a CPU rehearsal of the whole script
if TINY:
    SHAPES = {"m100": (64, 1, 2, 2, 32, 4, 3), "m1b": (96, 2, 2, 2, 32, 4, 2)}
CUDA = "cpu" if TINY else "cuda"


def log(msg):
    print(f"== {time.strftime('%H:%M:%S')} {msg}", flush=True)


def save():
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(RESULTS, f, indent=1)


def plan_text(name, shape, stages, steps=None, tiny=False):
    d, layers, heads, batch, seq, nsteps, _ = shape
    nsteps = steps or nsteps
    lines = [f'[run]\nname = "{name}"\ngpu_tolerance_mib = 64\n']
    for k in range(1, stages + 1):
        lines.append(f'[[stage]]\nname = "s{k}"\nkind = "train"')
        if k > 1:
            lines.append(f'after = ["s{k - 1}"]\ninit = "s{k - 1}"')
        lines.append("[stage.params]")
        lines.append(
            f'data = "synthetic:pretrain"\nsteps = {nsteps}\nbatch_size = {batch}\nseq_len = {seq}\n'
            f"lr = 3e-4\nprogress_every_s = 5.0"
        )
        if k == 1:
            lines.append(f"model = {{ d_model = {d}, n_layers = {layers}, n_heads = {heads}, max_seq_len = {seq} }}")
        lines.append("")
    return "\n".join(lines)


def run_orchestrate(tag, shape, stages, fork_server=True, steps=None, env_extra=None):
    plan = os.path.join(WORK, f"{tag}.toml")
    with open(plan, "w") as f:
        f.write(plan_text(tag, shape, stages, steps))
    run_dir = os.path.join(WORK, tag)
    env = dict(os.environ)
    if not fork_server:
        env["ORCHESTRATE_FORK_SERVER"] = "0"
    env.update(env_extra or {})
    t0 = time.time()
    p = subprocess.run([ORCH, "--plan", plan, "--run-dir", run_dir, "--worker", WORKER, "-q"],
                       env=env, capture_output=True, text=True, timeout=400)
    wall = time.time() - t0
    report = json.load(open(os.path.join(run_dir, "report.json")))
    rows = []
    for s in report["stages"]:
        t, m = s.get("timing") or {}, s.get("metrics") or {}
        row = {"stage": s["name"], "status": s["status"], "spawned": t.get("spawned"),
               "exited": t.get("exited"), "verified": t.get("verified"),
               "gpu": s.get("gpu"), "checkpoints": s.get("checkpoints")}
        row.update({k: v for k, v in m.items() if k.startswith("t_") or k in ("checkpoint_write_s", "tokens_per_s", "final_loss",
                                                                 "pinned_buffers", "fused_adamw")})
        rows.append(row)
    stderr_lines, forked, stderr_first, stderr_all = {}, {}, "", {}
    for s in report["stages"]:
        log_path = os.path.join(run_dir, "stages", s["name"], "stderr.log")
        try:
            text = open(log_path).read()
        except OSError:
            continue
        stderr_lines[s["name"]] = text.count("\n")
        stderr_all[s["name"]] = text[-6000:]
        forked[s["name"]] = "started by the fork server" in text
        stderr_first = stderr_first or text
    return {"variant": "orchestrate" if fork_server else "orchestrate-exec", "rc": p.returncode,
            "wall_s": wall, "stages": rows, "stderr_lines": stderr_lines, "forked": forked,
            "stderr_of_first_stage": stderr_first[-4000:],
            "stderr": stderr_all if (env_extra or {}).get("STAGE_WORKER_TRACE") == "1" else None,
            "console_tail": (p.stdout + p.stderr)[-3000:]}


def peer_args(shape, steps=None):
    d, layers, heads, batch, seq, nsteps, _ = shape
    return ["--d-model", str(d), "--layers", str(layers), "--heads", str(heads), "--batch", str(batch),
            "--seq", str(seq), "--steps", str(steps or nsteps)]


def run_python_fresh(tag, shape, stages):
    root = os.path.join(WORK, tag)
    rows, prev = [], None
    t0 = time.time()
    for k in range(1, stages + 1):
        out = os.path.join(root, f"s{k}")
        cmd = [sys.executable, PEER, "stage", "--out", out] + (["--init", prev] if prev else []) + peer_args(shape)
        spawned = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        exited = time.time()
        row = {"stage": f"s{k}", "rc": p.returncode, "spawned": spawned, "exited": exited}
        try:
            row.update(json.loads(p.stdout.strip().splitlines()[-1]))
        except (IndexError, ValueError):
            row["error"] = p.stderr[-2000:]
        rows.append(row)
        prev = out
    return {"variant": "python-fresh", "wall_s": time.time() - t0, "stages": rows}


def run_python_one(tag, shape, stages):
    root = os.path.join(WORK, tag)
    cmd = [sys.executable, PEER, "chain", "--root", root, "--stages", str(stages)] + peer_args(shape)
    spawned = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    wall = time.time() - spawned
    rows = []
    for i, line in enumerate(l for l in p.stdout.splitlines() if l.startswith("{")):
        row = json.loads(line)
        row["stage"] = f"s{i + 1}"
        rows.append(row)
    if rows:
        rows[0]["spawned"] = spawned
    return {"variant": "python-one", "rc": p.returncode, "wall_s": wall, "stages": rows,
            "stderr_tail": p.stderr[-1500:] if p.returncode else ""}


def breakdown(variant, steps):
    """Per-stage phases (seconds) and the boundary overhead."""
    out = []
    stages = variant["stages"]
    for i, s in enumerate(stages):
        start = s.get("spawned") or s.get("t_start")
        if start is None or "t_last_step" not in s:
            out.append({"stage": s.get("stage"), "error": s.get("error") or s.get("status")})
            continue
        end = s.get("verified") or s.get("exited") or s.get("t_end")
        nxt = None
        if i + 1 < len(stages):
            nxt = stages[i + 1].get("spawned") or stages[i + 1].get("t_start")
        steady = (s["t_last_step"] - s["t_first_step"]) * steps / (steps - 1)
        ph = {"stage": s["stage"]}
        worker_start = s.get("t_worker_start") or s.get("t_main")
        marks = [("worker_started", worker_start), ("import_done", s.get("t_import")),
                 ("device_ready", s.get("t_device_ready")), ("model_ready", s.get("t_model_ready")),
                 ("first_step", s.get("t_first_step")), ("last_step", s.get("t_last_step")),
                 ("checkpoint_durable", s.get("t_checkpoint_durable")), ("end", end)]
        prev = start
        for name, t in marks:
            if t is None:
                continue
            ph[name + "_s"] = round(t - prev, 4)
            prev = t
        ph["cold_start_s"] = round(s["t_device_ready"] - start, 4)
        # Every milestone as seconds from spawn (the finer ones too: inputs read, model built,
        # device released).
        ph["at"] = {k: round(v - start, 4) for k, v in s.items()
                    if k.startswith("t_") and isinstance(v, (int, float))}
        for k in ("exited", "verified"):
            if s.get(k):
                ph["at"][k] = round(s[k] - start, 4)
        ph["wall_s"] = round(end - start, 4)
        ph["steady_train_s"] = round(steady, 4)
        ph["overhead_s"] = round(end - start - steady, 4)
        if nxt:
            ph["handoff_s"] = round(nxt - end, 4)
        out.append(ph)
    return out


def cold_start():
    res = {}
    tiny = (64, 1, 2, 1, 16, 1, 6)
    for fork in (True, False):
        r = run_orchestrate(f"cold-{'fork' if fork else 'exec'}", tiny, 6, fork_server=fork, steps=2)
        res[r["variant"]] = [
            {"stage": s["stage"], "cold_start_s": s["t_device_ready"] - s["spawned"],
             "worker_start_s": s["t_worker_start"] - s["spawned"]}
            for s in r["stages"] if "t_device_ready" in s]
    code = ("import time; t=time.time(); import torch; "
            f"torch.zeros(1, device='{CUDA}').sum().item(); print(time.time(), t)")
    py = []
    for _ in range(3):
        spawned = time.time()
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        done, started = map(float, p.stdout.split())
        py.append({"cold_start_s": done - spawned, "worker_start_s": started - spawned})
    res["python"] = py
    return res


def dd(nbytes, tag):
    path = os.path.join(WORK, f"dd-{tag}.bin")
    count = math.ceil(nbytes / (16 << 20))
    t0 = time.time()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={count}", "conv=fsync"],
                   capture_output=True, timeout=200)
    wall = time.time() - t0
    os.remove(path)
    return {"bytes": count * (16 << 20), "wall_s": wall, "gb_per_s": count * (16 << 20) / wall / 1e9}


def checkpoint_bytes(variant):
    for s in variant["stages"]:
        if s.get("checkpoints"):
            return sum(c["bytes"] for c in s["checkpoints"])
    return 0


def clean(*names):
    for n in names:
        shutil.rmtree(os.path.join(WORK, n), ignore_errors=True)


def repeat_orchestrate(model, shape, stages):
    """The orchestrate variant again (ORCH_REPS in all, default 1), for a median and a range."""
    runs = []
    for k in range(2, int(os.environ.get("ORCH_REPS", "1")) + 1):
        log(f"{model}: orchestrate, repetition {k}")
        r = run_orchestrate(f"{model}-orch{k}", shape, stages)
        r["breakdown"] = breakdown(r, shape[5])
        r.pop("stderr_of_first_stage", None)
        runs.append(r)
        clean(f"{model}-orch{k}")
    return runs


def ab():
    """m100 chains under orchestrate with different stage-worker settings (AB: name:VAR=V,...)."""
    shape = SHAPES["m100"]
    spec = os.environ.get("AB", "base:STAGE_WORKER_EARLY_RELEASE=0 release: "
                          "split:STAGE_WORKER_WARMUP=split off:STAGE_WORKER_WARMUP=off")
    res = {}
    for item in spec.split():
        name, _, assigns = item.partition(":")
        env = dict(a.split("=", 1) for a in assigns.split(",") if a)
        log(f"ab: {name} {env}")
        try:
            r = run_orchestrate(f"ab-{name}", shape, shape[6], env_extra=env)
            r["breakdown"] = breakdown(r, shape[5])
        except Exception as e:
            r = {"error": repr(e)}
        r["env"] = env
        res[name] = r
        RESULTS["ab"] = res
        save()
        clean(f"ab-{name}")
    return res


def chain(model):
    shape = SHAPES[model]
    stages = shape[6]
    res = {}
    variants = [("orchestrate", lambda: run_orchestrate(f"{model}-orch", shape, stages)),
                ("orchestrate-reps", lambda: repeat_orchestrate(model, shape, stages)),
                ("orchestrate-exec", lambda: run_orchestrate(f"{model}-exec", shape, stages, fork_server=False)),
                ("python-fresh", lambda: run_python_fresh(f"{model}-pyfresh", shape, stages)),
                ("python-one", lambda: run_python_one(f"{model}-pyone", shape, stages))]
    if model == "m1b":
        variants = [v for v in variants if v[0] != "orchestrate-exec"]
    if os.environ.get("CHAIN_VARIANTS"):  # e.g. "orchestrate orchestrate-reps python-one"
        variants = [v for v in variants if v[0] in os.environ["CHAIN_VARIANTS"].split()]
    for name, fn in variants:
        log(f"{model}: {name}")
        try:
            r = fn()
        except Exception as e:  # keep going: one variant's failure must not lose the others
            r = {"variant": name, "error": repr(e)}
        if isinstance(r, dict) and "stages" in r:
            r["breakdown"] = breakdown(r, shape[5])
        res[name] = r
        RESULTS[model] = res
        save()
        if name == "orchestrate" and isinstance(r, dict) and "stages" in r:
            res["checkpoint_bytes"] = checkpoint_bytes(r)
        clean(f"{model}-orch", f"{model}-exec", f"{model}-pyfresh", f"{model}-pyone")
    return res


def main():
    os.makedirs(WORK, exist_ok=True)
    RESULTS["machine"] = open(os.path.join(OUT, "machine.txt")).read()
    if "probe" in PARTS:
        log("disk probe")
        p = subprocess.run([sys.executable, os.path.join(HERE, "probe.py"), os.path.join(WORK, "probe"),
                            os.environ.get("PROBE_BYTES", "1220000000"), "3"],
                           capture_output=True, text=True, timeout=300)
        try:
            RESULTS["probe"] = json.loads(p.stdout)
        except ValueError:
            RESULTS["probe"] = {"error": p.stderr[-2000:]}
        save()
    if "trace" in PARTS:
        log("trace")
        shape = SHAPES["m100"]
        r = run_orchestrate("trace", shape, 3, env_extra={"STAGE_WORKER_TRACE": "1"})
        r["breakdown"] = breakdown(r, shape[5])
        RESULTS["trace"] = r
        save()
        clean("trace")
    if "ab" in PARTS:
        ab()
    if "cold" in PARTS:
        log("cold start")
        RESULTS["cold_start"] = cold_start()
        save()
    for model in ("m100", "m1b"):
        if model in PARTS:
            chain(model)
            if "dd" in PARTS and RESULTS[model].get("checkpoint_bytes"):
                log(f"dd {model}")
                RESULTS[model]["dd"] = dd(RESULTS[model]["checkpoint_bytes"], model)
                save()
    save()


if __name__ == "__main__":
    main()
