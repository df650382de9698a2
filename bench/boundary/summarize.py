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

print("\n".join(out))
