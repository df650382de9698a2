#!/usr/bin/env python3
"""Markdown summary of the boundary benchmark's results.json (see bench.py)."""
import json, statistics, sys

R = json.load(open(sys.argv[1]))
out = []
p = out.append


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def f(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


p("# Stage boundary benchmark\n")
p("```\n" + R.get("machine", "").strip() + "\n```\n")

cs = R.get("cold_start")
if cs:
    p("## Cold start: spawn → first CUDA result (s)\n")
    p("| how | runs | median | min | max | spawn → process running (median) |")
    p("|---|---|---|---|---|---|")
    rows = []
    fork = cs.get("orchestrate", [])
    if fork:
        rows.append(("fork server, first stage (server starts)", fork[:1]))
        rows.append(("fork server, later stages", fork[1:]))
    rows.append(("exec (ORCHESTRATE_FORK_SERVER=0)", cs.get("orchestrate-exec", [])))
    rows.append(("Python: import torch + first CUDA result", cs.get("python", [])))
    for name, xs in rows:
        c = [x["cold_start_s"] for x in xs]
        w = [x["worker_start_s"] for x in xs]
        if c:
            p(f"| {name} | {len(c)} | {f(med(c), 3)} | {f(min(c), 3)} | {f(max(c), 3)} | {f(med(w), 3)} |")
    p("")

TITLES = {"m100": "100M model (d_model 1024, 8 layers)", "m1b": "1B model (d_model 2048, 20 layers)"}
for model in ("m100", "m1b"):
    res = R.get(model)
    if not res:
        continue
    p(f"## {TITLES[model]}\n")
    variants = [v for v in ("orchestrate", "orchestrate-exec", "python-fresh", "python-one") if v in res]
    p("Per stage (median over the chain's stages, seconds): phases from the previous mark.\n")
    cols = ["worker_started_s", "import_done_s", "device_ready_s", "model_ready_s", "first_step_s",
            "last_step_s", "checkpoint_durable_s", "end_s", "handoff_s", "wall_s", "steady_train_s", "overhead_s"]
    p("| variant | " + " | ".join(c[:-2] for c in cols) + " |")
    p("|---|" + "---|" * len(cols))
    for v in variants:
        b = [x for x in res[v].get("breakdown", []) if "wall_s" in x]
        if not b:
            p(f"| {v} | failed: {res[v].get('error') or res[v].get('stages')} |")
            continue
        p(f"| {v} | " + " | ".join(f(med([x.get(c) for x in b])) for c in cols) + " |")
    p("")
    p("`end` is: verified by orchestrate (orchestrate), process exit (python-fresh), clean-up done (python-one). "
      "`handoff` is from there to the next stage's spawn.\n")
    p("| variant | chain stages | chain wall (s) | vs python-one | stage overhead, each stage (s) |")
    p("|---|---|---|---|---|")
    base = res.get("python-one", {}).get("wall_s")
    for v in variants:
        r = res[v]
        w = r.get("wall_s")
        over = ", ".join(f(x.get("overhead_s")) for x in r.get("breakdown", []))
        ratio = f(w / base) if w and base else "—"
        p(f"| {v} | {len(r.get('stages', []))} | {f(w)} | {ratio} | {over} |")
    p("")
    orch = res.get("orchestrate", {})
    nbytes = res.get("checkpoint_bytes")
    writes = [s.get("checkpoint_write_s") for s in orch.get("stages", [])]
    if nbytes and any(writes):
        w = med(writes)
        p(f"Checkpoint per stage: {nbytes / 1e9:.2f} GB (model + optimizer + manifest); stage-worker writes it in "
          f"{f(w, 3)} s median ({nbytes / w / 1e9:.2f} GB/s), every stage: {', '.join(f(x, 3) for x in writes)}.")
        dd = res.get("dd")
        if dd:
            p(f"`dd conv=fsync` of {dd['bytes'] / 1e9:.2f} GB on the same disk: {f(dd['wall_s'], 3)} s "
              f"({dd['gb_per_s']:.2f} GB/s); stage-worker / dd time ratio for the same bytes: "
              f"{(w / nbytes) / (dd['wall_s'] / dd['bytes']):.2f}.")
        p("")
    lines = orch.get("stderr_lines")
    if lines:
        p(f"stderr.log lines per orchestrate stage: {lines}; started by the fork server: {orch.get('forked')}\n")
    gpu = [g for s in orch.get("stages", []) for g in (s.get("gpu") or [])]
    if gpu:
        p("GPU check per stage: " + ", ".join(f"{g['verdict']} ({g['reclaim_ms']:.1f} ms)" for g in gpu) + "\n")



def later(b):
    """Stages 2.. of a breakdown (stage 1 also starts the fork server and reads cold files)."""
    return [x for x in b[1:] if "wall_s" in x]


def at(x, k):
    return (x.get("at") or {}).get(k)


def span(x, a, b):
    ta, tb = at(x, a), at(x, b)
    return None if ta is None or tb is None else tb - ta


DETAIL = [("ctx", lambda x: at(x, "t_device_ready")),
          ("inputs read", lambda x: span(x, "t_device_ready", "t_inputs_read")),
          ("model built", lambda x: span(x, "t_device_ready", "t_model_built")),
          ("model ready", lambda x: span(x, "t_device_ready", "t_model_ready")),
          ("first step", lambda x: span(x, "t_model_ready", "t_first_step")),
          ("last step", lambda x: span(x, "t_first_step", "t_last_step")),
          ("released", lambda x: span(x, "t_last_step", "t_device_released")),
          ("durable", lambda x: span(x, "t_last_step", "t_checkpoint_durable")),
          ("exit", lambda x: span(x, "t_checkpoint_durable", "exited")),
          ("verified", lambda x: span(x, "t_checkpoint_durable", "verified")),
          ("wall", lambda x: x.get("wall_s")),
          ("overhead", lambda x: x.get("overhead_s"))]


def detail_table(rows):
    """rows: (label, [breakdown entries]); medians of each span, from spawn or from the named mark."""
    p("| run | stages | " + " | ".join(n for n, _ in DETAIL) + " |")
    p("|---|---|" + "---|" * len(DETAIL))
    for label, xs in rows:
        p(f"| {label} | {len(xs)} | " + " | ".join(f(med([fn(x) for x in xs])) for _, fn in DETAIL) + " |")
    p("")
    p("Medians, seconds. `ctx`: spawn → first CUDA result; `inputs read`, `model built`, `model ready`: from "
      "then (the warm-up runs alongside); `first step`: from model ready; `released`: last step → CUDA context "
      "destroyed (the data on the host, the disk still writing); `durable`: last step → checkpoint durable; "
      "`exit`: durable → process reaped; `verified`: durable → GPU check passed.\n")


PHASES = [("copied model", "t_copied_model"), ("copied optimizer", "t_copied_optimizer"),
          ("released", "t_device_released"), ("driver closed", "t_driver_closed"),
          ("hashed model", "t_hashed_model"), ("hashed optimizer", "t_hashed_optimizer"),
          ("written model", "t_written_model"), ("written optimizer", "t_written_optimizer"),
          ("synced model", "t_synced_model"), ("synced optimizer", "t_synced_optimizer"),
          ("durable", "t_checkpoint_durable"), ("exited", "exited"), ("verified", "verified")]


def phase_table(rows):
    """rows: (label, [breakdown entries]); each checkpoint phase as a median from the last step."""
    cols = [(n, k) for n, k in PHASES if any(at(x, k) is not None for _, xs in rows for x in xs)]
    if not cols:
        return
    p("| run | stages | " + " | ".join(n for n, _ in cols) + " |")
    p("|---|---|" + "---|" * len(cols))
    for label, xs in rows:
        p(f"| {label} | {len(xs)} | "
          + " | ".join(f(med([span(x, "t_last_step", k) for x in xs])) for _, k in cols) + " |")
    p("")
    p("Medians, seconds from the last step: every chunk of a file copied off the device, the CUDA context "
      "destroyed (and the NVIDIA device files closed, where asked), its checksum done, its last byte "
      "written, fsynced; then the manifest (checkpoint durable), the process reaped, the GPU check passed.\n")


m100 = R.get("m100") or {}
if m100.get("orchestrate") and "breakdown" in m100["orchestrate"]:
    runs = [m100["orchestrate"]] + [r for r in m100.get("orchestrate-reps") or [] if "breakdown" in r]
    p(f"## 100M model, orchestrate (fork server): {len(runs)} repetitions of the chain\n")
    detail_table([(f"repetition {i + 1}", later(r["breakdown"])) for i, r in enumerate(runs)]
                 + [("all", [x for r in runs for x in later(r["breakdown"])])])
    over = [x["overhead_s"] for r in runs for x in later(r["breakdown"])]
    per_run = [med([x["overhead_s"] for x in later(r["breakdown"])]) for r in runs]
    walls = [r.get("wall_s") for r in runs]
    if over:
        p(f"Boundary overhead of the 100M train stage (stages 2–{len(runs[0]['breakdown'])}, every repetition): "
          f"median {f(med(over))} s, range {f(min(over))}–{f(max(over))} s over {len(over)} stages; "
          f"per repetition (median of its stages): {', '.join(f(x) for x in per_run)}; "
          f"stage 1 of each: {', '.join(f(r['breakdown'][0].get('overhead_s')) for r in runs)}. "
          f"Chain walls: {', '.join(f(w) for w in walls)} s.\n")
    # The span the chain itself waits at each boundary: a stage's last step to the next one's
    # first step (with early starts the next stage's start overlaps the previous one's
    # persisting, which the overhead above counts in both stages).
    def step_gaps(stages):
        st = sorted((s for s in stages if "t_first_step" in s and "t_last_step" in s),
                    key=lambda s: s["t_first_step"])
        return [b["t_first_step"] - a["t_last_step"] for a, b in zip(st, st[1:])]
    gaps = {name: [g for r in rs for g in step_gaps(r.get("stages") or [])]
            for name, rs in (("orchestrate", runs), ("python-one", [m100.get("python-one") or {}]))}
    if gaps["orchestrate"]:
        line = (f"Last step → next first step: orchestrate median {f(med(gaps['orchestrate']))} s, range "
                f"{f(min(gaps['orchestrate']))}–{f(max(gaps['orchestrate']))} s over {len(gaps['orchestrate'])} boundaries")
        if gaps["python-one"]:
            line += (f"; python-one (one process) median {f(med(gaps['python-one']))} s, range "
                     f"{f(min(gaps['python-one']))}–{f(max(gaps['python-one']))} s over {len(gaps['python-one'])}")
        p(line + ".\n")
    p("Where the checkpoint's time goes (same stages):\n")
    phase_table([("all", [x for r in runs for x in later(r["breakdown"])])])

AB = R.get("ab")
if AB:
    p("## Settings compared (100M chains under orchestrate, stages 2.. of each)\n")
    detail_table([(f"{k} {v.get('env')}", later(v.get("breakdown", []))) for k, v in AB.items()])
    for k, v in AB.items():
        p(f"- {k}: overhead each stage {', '.join(f(x.get('overhead_s')) for x in v.get('breakdown', []))}; "
          f"chain wall {f(v.get('wall_s'))} s; rc {v.get('rc')}")
    p("")
    p("Checkpoint phases of those stages:\n")
    phase_table([(k, later(v.get("breakdown", []))) for k, v in AB.items()])

T = R.get("trace")
if T:
    p("## Trace (STAGE_WORKER_TRACE=1: each kind of operation timed on its own, synchronised)\n")
    detail_table([("trace", T.get("breakdown", []))])
    for st in T.get("stages", []):
        text = (T.get("stderr") or {}).get(st["stage"], "")
        lines = [l for l in text.splitlines() if "warm-up" in l or "exiting" in l]
        exit_line = [l for l in lines if "exiting at" in l]
        gap = ""
        if exit_line and st.get("exited"):
            t_exit = float(exit_line[-1].rsplit(" ", 1)[1])
            gap = f" (_exit → reaped: {st['exited'] - t_exit:.3f} s)"
        p(f"{st['stage']}{gap}:\n```\n" + "\n".join(lines) + "\n```")
    p("")

PR = R.get("probe")
if PR and PR.get("variants"):
    p(f"## Disk probe: {PR['bytes'] / 1e9:.2f} GB written and fsynced, each way 3 times\n")
    p("| how | median (s) | GB/s | runs (s) |")
    p("|---|---|---|---|")
    for k, v in PR["variants"].items():
        if "median_s" in v:
            p(f"| {k} | {f(v['median_s'], 3)} | {PR['bytes'] / v['median_s'] / 1e9:.2f} | "
              f"{', '.join(f(x, 3) for x in v['wall_s'])} |")
        else:
            p(f"| {k} | {v.get('error')} | | |")
    p("")

print("\n".join(out))
