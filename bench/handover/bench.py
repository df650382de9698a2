#!/usr/bin/env python3
"""The hand-on-at-release benchmark's driver (see run.sh): 100M built-in train stages, four at
a time on one GPU, in two shapes:
  chain        s1 → s2 → s3 → s4, each from its parent's weights, by default in four modes:
               `early` (the GPU handed on at release and the downstream stage started early,
               while its upstream persists its checkpoint, its worker a standby readied at the
               upstream's last step: the defaults), `early-nostandby` (the same, every worker
               forked at its start: ORCHESTRATE_STANDBY=0), `on` (handed on, no early start:
               ORCHESTRATE_EARLY_START=0, so the downstream starts after its upstream
               succeeded) and `off` (ORCHESTRATE_HAND_ON_AT_RELEASE=0); CHAIN_MODES may add
               `early-fsync` and `early-inline` (the upstream's write-back started only by
               its fsync, or inside each write as before: STAGE_WORKER_WRITEBACK)
  independent  four stages with no dependencies, max_parallel = 2, all on the one GPU: the
               next stage starts when the previous one releases the GPU; modes `on`, `off`
Each variant runs twice, in alternating order, after one warm-up run. Per run: wall, Σ steady training,
and the boundary overhead per stage = (wall − Σ steady) / stages; per boundary: from the
previous stage's last step to the next stage's spawn and to its first step.
Writes OUT/results.json and prints a summary (OUT/summary.md).
"""
import json
import os, shutil, subprocess, sys, time

BIN, OUT, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
ORCH, WORKER = os.path.join(BIN, "orchestrate"), os.path.join(BIN, "stage-worker")
# A CPU rehearsal of the script: one fake GPU, and the worker's simulated CUDA device (which
# releases at the end of its training as on CUDA, its manifest 100 ms later).
TINY = os.environ.get("BENCH_TINY") == "1"
# d_model, layers, heads, batch, seq, steps
SHAPE = (64, 1, 2, 2, 32, 4) if TINY else (1024, 8, 16, 32, 256, 60)
STAGES = 4
REPEATS = int(os.environ.get("REPEATS", "2"))


def plan(tag, independent):
    d, layers, heads, batch, seq, steps = SHAPE
    # max_parallel = 2 for the chain too: an early start needs a slot beside its upstream's.
    out = [f'[run]\nname = "{tag}"\ngpu_tolerance_mib = 64\nmax_parallel = 2\n']
    for k in range(1, STAGES + 1):
        out.append(f'[[stage]]\nname = "s{k}"\nkind = "train"\ngpus = 1')
        if k > 1 and not independent:
            out.append(f'after = ["s{k - 1}"]\ninit = "s{k - 1}"')
        out.append("[stage.params]")
        out.append(f'data = "synthetic:pretrain"\nsteps = {steps}\nbatch_size = {batch}\nseq_len = {seq}\n'
                   f"lr = 3e-4\nprogress_every_s = 5.0\nseed = {k}")
        if k == 1 or independent:
            out.append(f"model = {{ d_model = {d}, n_layers = {layers}, n_heads = {heads}, max_seq_len = {seq} }}")
        out.append("")
    return "\n".join(out)


def run(tag, independent, mode):
    path = os.path.join(WORK, tag + ".toml")
    with open(path, "w") as f:
        f.write(plan(tag, independent))
    run_dir = os.path.join(WORK, tag)
    env = dict(os.environ)
    env["ORCHESTRATE_HAND_ON_AT_RELEASE"] = "0" if mode == "off" else "1"
    env["ORCHESTRATE_EARLY_START"] = "1" if mode.startswith("early") else "0"
    # The A/B settings of a mode (how checkpoint files reach the disk, standbys, when the
    # released worker closes the driver's files); the defaults otherwise.
    for settings in MODE_ENV.values():
        for k in settings:
            env.pop(k, None)
    env.update(MODE_ENV.get(mode, {}))
    if TINY:
        holders = os.path.join(WORK, "holders")
        os.makedirs(holders, exist_ok=True)
        env.update(ORCHESTRATE_FAKE_GPUS="1", ORCHESTRATE_FAKE_GPU_DIR=holders,
                   STAGE_WORKER_SIMULATED_CUDA="100")
    t0 = time.time()
    p = subprocess.run([ORCH, "--plan", path, "--run-dir", run_dir, "--worker", WORKER, "-q"],
                       env=env, capture_output=True, text=True, timeout=300)
    wall = time.time() - t0
    report = json.load(open(os.path.join(run_dir, "report.json")))
    # A failed stage's own words, kept before its run directory goes.
    # Which stages' workers were standbys the fork server had readied (stage-worker's
    # stage_standby.rs), read before the run directory goes.
    standby = {s["name"]: "from a standby" in open(os.path.join(run_dir, "stages", s["name"], "stderr.log")).read()
               for s in report["stages"]
               if os.path.exists(os.path.join(run_dir, "stages", s["name"], "stderr.log"))}
    failures = {s["name"]: open(os.path.join(run_dir, "stages", s["name"], "stderr.log")).read()[-1500:]
                for s in report["stages"]
                if s.get("status") not in ("succeeded", None)
                and os.path.exists(os.path.join(run_dir, "stages", s["name"], "stderr.log"))}
    # Each run leaves 4.9 GB of checkpoints: removed, so that a long benchmark never fills the
    # disk (a 64 GiB one filled during the 2026-12-02 run's last chain, which then failed).
    shutil.rmtree(run_dir, ignore_errors=True)
    stages = []
    for s in report["stages"]:
        t, m = s.get("timing") or {}, s.get("metrics") or {}
        stages.append({"stage": s["name"], "status": s["status"], "gpu": s.get("gpu"),
                       "started_early": bool(s.get("started_early")),
                       "standby": standby.get(s["name"], False), **t,
                       **{k: v for k, v in m.items()
                          if k.startswith("t_") or k in ("tokens_per_s", "input_wait_s", "init_read_early")}})
    stages.sort(key=lambda s: s.get("spawned") or 0)
    steps = SHAPE[5]
    steady = sum((s["t_last_step"] - s["t_first_step"]) * steps / (steps - 1)
                 for s in stages if "t_last_step" in s and "t_first_step" in s)
    first, last = stages[0].get("spawned"), max(s.get("verified") or 0 for s in stages)
    span = (last - first) if first and last else None
    boundaries = []
    for a, b in zip(stages, stages[1:]):
        placed = [k for k in a if k.startswith("t_written_")]
        if "t_last_step" in a and b.get("spawned"):
            boundaries.append({
                "from": a["stage"], "to": b["stage"],
                "last_step_to_spawn_s": round(b["spawned"] - a["t_last_step"], 4),
                "last_step_to_first_step_s": round(b["t_first_step"] - a["t_last_step"], 4) if "t_first_step" in b else None,
                "released_at_s": round(a["released"] - a["t_last_step"], 4) if a.get("released") else None,
                "spawn_before_exit_s": round(a["exited"] - b["spawned"], 4) if a.get("exited") else None,
                "started_early": bool(b.get("started_early")),
                "standby": b.get("standby", False),
                "spawn_to_cuda_init_s": round(b["t_cuda_init"] - b["spawned"], 4) if "t_cuda_init" in b else None,
                "spawn_to_device_ready_s": round(b["t_device_ready"] - b["spawned"], 4) if "t_device_ready" in b else None,
                "device_ready_to_model_ready_s": round(b["t_model_ready"] - b["t_device_ready"], 4) if "t_model_ready" in b and "t_device_ready" in b else None,
                "input_wait_s": b.get("input_wait_s"),
                "init_read_early": bool(b.get("init_read_early")),
                # The upstream's files complete and in place (its manifest follows at once).
                "files_in_place_s": round(max(a[k] for k in placed) - a["t_last_step"], 4) if placed else None,
            })
    return {"tag": tag, "independent": independent, "mode": mode, "hand_on": mode != "off",
            "early_start": mode.startswith("early"), "rc": p.returncode,
            "wall_s": round(wall, 3), "span_s": round(span, 3) if span else None,
            "steady_s": round(steady, 3),
            "overhead_per_stage_s": round((span - steady) / STAGES, 4) if span else None,
            "at_release": [bool(g.get("at_release")) for s in stages for g in (s.get("gpu") or [])],
            "boundaries": boundaries, "stages": stages,
            "console_tail": (p.stdout + p.stderr)[-2000:] if p.returncode else "",
            "failed_stage_logs": failures}


# Shapes and their modes (see the docstring); CHAIN_MODES and INDEPENDENT_MODES pick others.
CHAIN_MODES = os.environ.get("CHAIN_MODES", "early early-nostandby on off").split()
INDEPENDENT_MODES = os.environ.get("INDEPENDENT_MODES", "on off").split()
VARIANTS = ((True, tuple(INDEPENDENT_MODES)), (False, tuple(CHAIN_MODES)))
# What a mode changes against the defaults:
# - early-fsync, early-inline: the upstream starts its checkpoint's write-back only at the
#   fsync, or inside each write as before 2026-12-02 (the default: behind its writers);
# - early-nostandby: no standby, every worker forked at its start (ORCHESTRATE_STANDBY=0).
# (38996ce's run also had early-closefirst and early-before, for a setting since removed:
# bench/handover/README.md.)
MODE_ENV = {
    "early-fsync": {"STAGE_WORKER_WRITEBACK": "fsync"},
    "early-inline": {"STAGE_WORKER_WRITEBACK": "inline"},
    "early-nostandby": {"ORCHESTRATE_STANDBY": "0"},
}


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def main():
    os.makedirs(WORK, exist_ok=True)
    results = {"shape": SHAPE, "stages": STAGES, "repeats": REPEATS, "runs": []}
    print("== warm-up", flush=True)
    results["warmup"] = run("warmup", True, "on")["wall_s"]
    for r in range(REPEATS):
        for independent, modes in VARIANTS:
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                tag = f"{'ind' if independent else 'chain'}-{mode}-{r}"
                res = run(tag, independent, mode)
                print(f"== {tag}: rc {res['rc']} span {res['span_s']} s, overhead/stage {res['overhead_per_stage_s']} s, "
                      f"at release {res['at_release']}", flush=True)
                results["runs"].append(res)
                with open(os.path.join(OUT, "results.json"), "w") as f:
                    json.dump(results, f, indent=1)
    lines = ["| shape | mode | runs | span (s) | overhead per stage (s), median (min–max) | "
             "last step → next spawn (s), median | last step → next first step (s), median (min–max) | "
             "next spawned before the previous exited (s), median | upstream's files in place after its last step (s), median | "
             "input wait (s), median | read before the manifest | started early | verdicts at release | "
             "from a standby | next spawn → its driver up, → device ready, → model ready (s), medians |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for independent, modes in VARIANTS:
        for mode in modes:
            rs = [x for x in results["runs"] if x["independent"] == independent and x["mode"] == mode]
            ov = [x["overhead_per_stage_s"] for x in rs if x["overhead_per_stage_s"] is not None]
            bs = [b for x in rs for b in x["boundaries"]]
            firsts = [b["last_step_to_first_step_s"] for b in bs if b["last_step_to_first_step_s"] is not None]
            before = [b["spawn_before_exit_s"] for b in bs if (b["spawn_before_exit_s"] or 0) > 0]
            lines.append(
                f"| {'independent' if independent else 'chain'} | {mode} | {len(rs)} "
                f"| {median([x['span_s'] for x in rs])} | {median(ov)} ({min(ov, default=None)}–{max(ov, default=None)}) "
                f"| {median([b['last_step_to_spawn_s'] for b in bs])} "
                f"| {median(firsts)} ({min(firsts, default=None)}–{max(firsts, default=None)}) "
                f"| {median(before) if before else '—'} "
                f"| {median([b['files_in_place_s'] for b in bs])} "
                f"| {median([b['input_wait_s'] for b in bs]) if any(b['input_wait_s'] for b in bs) else '—'} "
                f"| {sum(b['init_read_early'] for b in bs)}/{len(bs)} "
                f"| {sum(b['started_early'] for b in bs)}/{len(bs)} "
                f"| {sum(sum(x['at_release']) for x in rs)}/{sum(len(x['at_release']) for x in rs)} "
                f"| {sum(b['standby'] for b in bs)}/{len(bs)} "
                f"| {median([b['spawn_to_cuda_init_s'] for b in bs])}, {median([b['spawn_to_device_ready_s'] for b in bs])}, "
                f"{median([b['device_ready_to_model_ready_s'] for b in bs])} |")
    failed = [x for x in results["runs"] if x["rc"] != 0]
    if failed:
        lines.append("")
        lines.append("Failed runs (console and failed stages' stderr, last lines):")
        for x in failed:
            lines.append(f"\n{x['tag']} (rc {x['rc']}):\n```\n{x['console_tail']}\n```")
            for name, text in x["failed_stage_logs"].items():
                lines.append(f"{name}:\n```\n{text}\n```")
    summary = "\n".join(lines) + "\n"
    with open(os.path.join(OUT, "summary.md"), "w") as f:
        f.write(summary)
    print(summary)


main()
