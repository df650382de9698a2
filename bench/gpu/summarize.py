#!/usr/bin/env python3
"""Turns the GPU benchmark's work directory (argv[1], written by run.sh) into summary.md
(stdout) and summary.json (in the same directory). Every figure comes from the reports,
journals and JSON files the runs wrote; nothing is typed in. A measured figure is given as
median and range (min–max) with the number of values and of reps it comes from."""
import glob, json, os, re, statistics, sys

W = sys.argv[1]
MIB = 2**20
summary = {}
out = []


def load(path):
    try:
        with open(os.path.join(W, path)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def text(path, default="missing"):
    try:
        return open(os.path.join(W, path)).read().strip()
    except OSError:
        return default


def reps():
    return sorted(int(m.group(1)) for d in glob.glob(os.path.join(W, "rep*"))
                  if (m := re.fullmatch(r"rep(\d+)", os.path.basename(d))))


def spread(values):
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"n": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}


def fs(values, f=".1f", unit=""):
    s = spread(values)
    if s is None:
        return "-"
    if s["n"] == 1:
        return f"{s['median']:{f}}{unit} (one value)"
    return f"{s['median']:{f}}{unit} ({s['min']:{f}}–{s['max']:{f}}, n={s['n']})"


def pct(values, q):
    values = sorted(values)
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def gpu0(s):
    return s["gpu"][0] if s.get("gpu") else None


def handoffs(report):
    """exit → next spawn (ms) for stages that ran one after another, in spawn order, with the
    first stage's checkpoint bytes; exit → verified clean (ms) for every stage."""
    st = sorted((s for s in report["stages"] if s.get("timing")), key=lambda s: s["timing"]["spawned"])
    pairs = []
    for a, b in zip(st, st[1:]):
        d = b["timing"]["spawned"] - a["timing"]["exited"]
        if d >= 0:
            pairs.append((d * 1e3, sum(c["bytes"] for c in a.get("checkpoints") or [])))
    verify = [(s["timing"]["verified"] - s["timing"]["exited"]) * 1e3 for s in st if s["timing"].get("verified")]
    return pairs, verify


R = reps()
uuids = set()
for p in glob.glob(os.path.join(W, "**", "report.json"), recursive=True):
    try:
        for s in json.load(open(p))["stages"]:
            for g in s.get("gpu") or []:
                uuids.add(g["uuid"])
    except (OSError, ValueError, KeyError):
        pass
machine = text("machine.txt")
out.append("# GPU benchmark results\n")
out.append("```\n" + machine + "\n```\n")
out.append(f"Reps found: {len(R)}. GPU UUIDs in all reports: {sorted(uuids)}. Figures: median (min–max, n = number of values) "
           "over all reps; \"one value\" where a part ran once.\n")
summary["machine"] = machine
summary["gpu_uuids_in_reports"] = sorted(uuids)
summary["reps"] = R
skipped = [l for l in text("log.txt", "").splitlines() if "skipped (budget" in l]
if skipped:
    out.append("Skipped for the time budget:\n\n" + "\n".join(f"- `{l}`" for l in skipped) + "\n")
summary["skipped"] = skipped

# Quickstart
qs = {r: load(f"rep{r}/quickstart/report.json") for r in R}
qs = {r: v for r, v in qs.items() if v}
if qs:
    exits = [text(f"rep{r}/quickstart.exit") for r in qs]
    out.append(f"## Quickstart on the GPU ({len(qs)} runs; exits {exits}; run status {[v['status'] for v in qs.values()]})\n")
    out.append(f"Run wall s: {fs([v['wall_s'] for v in qs.values()], '.2f')}\n")
    out.append("| stage | wall s | tokens/s | final loss | accuracy | GPU after − baseline MiB | reclaim ms | verdicts |")
    out.append("|---|---|---|---|---|---|---|---|")
    rows = {}
    for v in qs.values():
        for s in v["stages"]:
            g = gpu0(s)
            m = s["metrics"]
            row = rows.setdefault(s["name"], {k: [] for k in ("wall_s", "tokens_per_s", "final_loss", "accuracy", "after_mib", "reclaim_ms", "verdict")})
            row["wall_s"].append(s["wall_s"])
            row["tokens_per_s"].append(m.get("tokens_per_s"))
            row["final_loss"].append(m.get("final_loss", m.get("loss")))
            row["accuracy"].append(m.get("accuracy"))
            row["after_mib"].append((g["after_bytes"] - g["baseline_bytes"]) / MIB if g else None)
            row["reclaim_ms"].append(g["reclaim_ms"] if g else None)
            row["verdict"].append(g["verdict"] if g else None)
    for name, row in rows.items():
        out.append(f"| {name} | {fs(row['wall_s'], '.2f')} | {fs(row['tokens_per_s'], '.0f')} | {fs(row['final_loss'], '.4f')} | "
                   f"{fs(row['accuracy'], '.3f')} | {fs(row['after_mib'], '.0f')} | {fs(row['reclaim_ms'], '.3f')} | {sorted(set(map(str, row['verdict'])))} |")
    out.append("")
    summary["quickstart"] = {"exits": exits, "run_wall_s": [v["wall_s"] for v in qs.values()], "stages": rows}

# Headline
pys = {r: load(f"rep{r}/one_process.json") for r in R}
fives = {r: load(f"rep{r}/five/report.json") for r in R}
pys = {r: v for r, v in pys.items() if v}
fives = {r: v for r, v in fives.items() if v}
if pys or fives:
    out.append(f"## Headline: device memory after each of 5 training stages ({len(pys)} Python runs, {len(fives)} orchestrate runs; "
               f"orchestrate exits {[text(f'rep{r}/five.exit') for r in fives]})\n")
    out.append(f"One Python process (PyTorch eager, stray reference kept, seeds' cleanup) started at {fs([p['before_mib'] for p in pys.values()], '.0f')} MiB; "
               f"orchestrate's first baseline: {fs([gpu0(f['stages'][0])['baseline_bytes'] / MIB for f in fives.values() if gpu0(f['stages'][0])], '.0f')} MiB. "
               f"Orchestrate run wall s: {fs([f['wall_s'] for f in fives.values()], '.1f')}.\n")
    out.append("| after stage | one Python process, MiB | orchestrate, MiB | orchestrate verdicts |")
    out.append("|---|---|---|---|")
    hl = {"python_after_mib": [], "orchestrate_after_mib": [], "python_tokens_per_s": [], "orchestrate_tokens_per_s": [],
          "python_before_mib": [p["before_mib"] for p in pys.values()],
          "orchestrate_baseline_mib": [gpu0(f["stages"][0])["baseline_bytes"] / MIB for f in fives.values() if gpu0(f["stages"][0])]}
    for i in range(5):
        a = [p["after_stage_mib"][i] for p in pys.values() if len(p["after_stage_mib"]) > i]
        b = [gpu0(f["stages"][i])["after_bytes"] / MIB for f in fives.values() if len(f["stages"]) > i and gpu0(f["stages"][i])]
        v = sorted({gpu0(f["stages"][i])["verdict"] for f in fives.values() if len(f["stages"]) > i and gpu0(f["stages"][i])})
        out.append(f"| {i + 1} | {fs(a, '.0f')} | {fs(b, '.0f')} | {v} |")
        hl["python_after_mib"].append(a)
        hl["orchestrate_after_mib"].append(b)
    out.append("")
    out.append("| stage | Python tokens/s | stage-worker tokens/s | stage-worker checkpoint bytes |")
    out.append("|---|---|---|---|")
    for i in range(5):
        a = [p["tokens_per_s"][i] for p in pys.values() if len(p["tokens_per_s"]) > i]
        b = [f["stages"][i]["metrics"].get("tokens_per_s") for f in fives.values() if len(f["stages"]) > i]
        c = [sum(c["bytes"] for c in f["stages"][i].get("checkpoints") or []) for f in fives.values() if len(f["stages"]) > i]
        out.append(f"| {i + 1} | {fs(a, '.0f')} | {fs(b, '.0f')} | {fs(c, '.0f')} |")
        hl["python_tokens_per_s"].append(a)
        hl["orchestrate_tokens_per_s"].append(b)
    out.append("")
    summary["headline"] = hl

# Reclaim and the no-checkpoint handoff (the same runs)
recs = {r: load(f"rep{r}/reclaim/report.json") for r in R}
recs = {r: v for r, v in recs.items() if v}
if recs:
    out.append(f"## Reclaim time after the worker's exit ({len(recs)} runs; exits {[text(f'rep{r}/reclaim.exit') for r in recs]})\n")
    out.append("`stage-worker hold --gib N` stages, one after another; time from the stage's last process gone to the first NVML "
               "reading back at baseline. Values pooled over all runs.\n")
    out.append("| allocation | n | median ms | min ms | max ms | per-run medians ms | verdicts |")
    out.append("|---|---|---|---|---|---|---|")
    summary["reclaim"] = {}
    for gib in (1, 8, 64):
        ms, per_run, peaks, verdicts = [], [], [], set()
        for v in recs.values():
            st = [s for s in v["stages"] if s["name"].startswith(f"hold-{gib}gib-") and gpu0(s)]
            run_ms = [gpu0(s)["reclaim_ms"] for s in st]
            ms += run_ms
            if run_ms:
                per_run.append(statistics.median(run_ms))
            peaks += [(gpu0(s)["peak_bytes"] - gpu0(s)["baseline_bytes"]) / 2**30 for s in st]
            verdicts |= {gpu0(s)["verdict"] for s in st}
        if ms:
            out.append(f"| {gib} GiB (peak seen {statistics.median(peaks):.1f} GiB) | {len(ms)} | {statistics.median(ms):.3f} | {min(ms):.3f} | "
                       f"{max(ms):.3f} | {', '.join(f'{x:.3f}' for x in per_run)} | {', '.join(sorted(verdicts))} |")
            summary["reclaim"][f"{gib}GiB"] = {"values_ms": ms, "per_run_median_ms": per_run, "verdicts": sorted(verdicts)}
    out.append("")


def handoff_section(title, runs, note):
    allp, allv, per_run, ck = [], [], [], []
    for v in runs.values():
        pairs, verify = handoffs(v)
        allp += [p[0] for p in pairs]
        ck += [p[1] for p in pairs]
        allv += verify
        if pairs:
            per_run.append(statistics.median([p[0] for p in pairs]))
    if not allp:
        return None
    out.append(f"| {title} | {len(runs)} | {len(allp)} | {statistics.median(allp):.3f} | {min(allp):.3f} | {pct(allp, .95):.3f} | {max(allp):.3f} | "
               f"{', '.join(f'{x:.3f}' for x in per_run)} | {statistics.median(allv):.3f} ({min(allv):.3f}–{max(allv):.3f}) | {statistics.median(ck) / 1e6:.0f} MB | {note} |")
    return {"exit_to_next_spawn_ms": allp, "per_run_median_ms": per_run, "exit_to_verified_ms": allv, "checkpoint_bytes_of_exiting_stage": ck}


sweeps = {r: load(f"rep{r}/sweep/report.json") for r in R}
sweeps = {r: v for r, v in sweeps.items() if v}
if recs or fives or qs or sweeps:
    out.append("## Handoff between consecutive stages on one GPU\n")
    out.append("exit → next spawn: worker exit collected → tree checked gone → NVML verdict clean → the exiting stage's outputs "
               "and checkpoints accepted → next worker spawned. Pooled over all runs of each kind; the checkpoint column is the "
               "median size of what the exiting stage wrote.\n")
    out.append("| stages | runs | n | median ms | min ms | p95 ms | max ms | per-run medians ms | exit → verified clean, median (range) ms | checkpoint written | what the stages are |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|")
    summary["handoff"] = {
        "no_checkpoint": handoff_section("no checkpoint (reclaim chain)", recs, "`stage-worker hold` 1/8/64 GiB, writes nothing"),
        "five_stage_training": handoff_section("training, 100M model (five-stage headline)", fives, "built-in train stages, model + AdamW state"),
        "sweep": handoff_section("training/eval, 12.8M model (seed 001 sweep)", sweeps, "base, fine-tune and eval instances"),
        "quickstart": handoff_section("quickstart", qs, "pretrain, sft, eval, eval-pretrain"),
    }
    out.append("")

# Seed 001's loop
pysw = {r: load(f"rep{r}/one_process_sweep.json") for r in R}
pysw = {r: v for r, v in pysw.items() if v}
if sweeps or pysw:
    n_samples = max([len(p["after_stage_mib"]) for p in pysw.values()] + [0])
    afters, bases, verdicts, nst = [], [], set(), []
    ft = {}
    for v in sweeps.values():
        inst = [s for s in v["stages"] if gpu0(s)]
        nst.append(len(inst))
        for s in inst:
            g = gpu0(s)
            afters.append(g["after_bytes"] / MIB)
            bases.append(g["baseline_bytes"] / MIB)
            verdicts.add(g["verdict"])
            if s["name"].startswith("finetune["):
                ft.setdefault(s["name"], []).append(g["after_bytes"] / MIB)
    out.append(f"## Seed 001's loop: fine-tune + eval per sample, {n_samples} samples per run ({len(sweeps)} orchestrate runs, exits "
               f"{[text(f'rep{r}/sweep.exit') for r in sweeps]}; {len(pysw)} Python runs)\n")
    if afters:
        out.append(f"Under orchestrate: {nst} stages on the GPU per run, verdicts {sorted(verdicts)}; device memory after every stage of every run: "
                   f"min {min(afters):.0f} MiB, max {max(afters):.0f} MiB (baselines {min(bases):.0f}–{max(bases):.0f} MiB). "
                   f"Run wall s: {fs([v['wall_s'] for v in sweeps.values()], '.1f')}.\n")
    out.append("| after sample | one Python process (references kept), MiB | orchestrate, after that sample's fine-tune, MiB |")
    out.append("|---|---|---|")
    names = sorted(ft)
    rows = []
    for k in range(max(n_samples, len(names))):
        a = [p["after_stage_mib"][k] for p in pysw.values() if len(p["after_stage_mib"]) > k]
        b = ft[names[k]] if k < len(names) else []
        out.append(f"| {k + 1} | {fs(a, '.0f')} | {fs(b, '.0f')} |")
        rows.append({"python_after_mib": a, "orchestrate_after_finetune_mib": b})
    growth = [p["after_stage_mib"][-1] - p["after_stage_mib"][0] for p in pysw.values() if len(p["after_stage_mib"]) > 1]
    per_sample = [g / (n_samples - 1) for g in growth] if n_samples > 1 else []
    if growth:
        out.append(f"\nPython process growth from the first to the last sample: {fs(growth, '.0f')} MiB, i.e. {fs(per_sample, '.0f')} MiB per sample.")
    out.append("")
    summary["sweep"] = {"samples": n_samples, "rows": rows, "orchestrate_after_mib_all": afters, "orchestrate_baselines_mib": bases,
                        "verdicts": sorted(verdicts), "python_growth_mib": growth, "python_growth_per_sample_mib": per_sample,
                        "run_wall_s": [v["wall_s"] for v in sweeps.values()]}

# Seed 000
s0s = {r: load(f"rep{r}/seed000/report.json") for r in R}
s0s = {r: v for r, v in s0s.items() if v}
if s0s:
    out.append(f"## Seed 000 with Accelerate as two stages ({len(s0s)} run(s); exits {[text(f'rep{r}/seed000.exit') for r in s0s]}; "
               f"run status {[v['status'] for v in s0s.values()]})\n")
    out.append("| stage | status | wall s | first loss | final loss | GPU after − baseline MiB | reclaim ms | verdicts |")
    out.append("|---|---|---|---|---|---|---|---|")
    rows = {}
    for v in s0s.values():
        for s in v["stages"]:
            g = gpu0(s) or {}
            m = s["metrics"]
            row = rows.setdefault(s["name"], {k: [] for k in ("status", "wall_s", "first_loss", "final_loss", "after_mib", "reclaim_ms", "verdict")})
            row["status"].append(s["status"])
            row["wall_s"].append(s["wall_s"])
            row["first_loss"].append(m.get("first_loss"))
            row["final_loss"].append(m.get("final_loss"))
            row["after_mib"].append((g["after_bytes"] - g["baseline_bytes"]) / MIB if g else None)
            row["reclaim_ms"].append(g.get("reclaim_ms"))
            row["verdict"].append(g.get("verdict"))
    for name, row in rows.items():
        out.append(f"| {name} | {sorted(set(row['status']))} | {fs(row['wall_s'], '.1f')} | {fs(row['first_loss'], '.3f')} | {fs(row['final_loss'], '.3f')} | "
                   f"{fs(row['after_mib'], '.0f')} | {fs(row['reclaim_ms'], '.3f')} | {sorted(set(map(str, row['verdict'])))} |")
    out.append("")
    summary["seed000"] = {"exits": [text(f"rep{r}/seed000.exit") for r in s0s], "stages": rows}

# Leak fixtures (pass/fail checks, run once each)
lg = load("leak-grandchild/report.json")
lo = load("leak-outside/report.json")
if lg or lo:
    out.append("## Leak fixtures (pass/fail checks, one run each)\n")
if lg:
    s = lg["stages"][0]
    g = gpu0(s) or {}
    out.append(f"- GPU-holding grandchild ({text('leak-grandchild.exit')}): stage `{s['name']}` {s['status']}; "
               f"leftover processes stopped: {s['leftover_processes']}; peak {(g.get('peak_bytes', 0) - g.get('baseline_bytes', 0)) / MIB:.0f} MiB above baseline; "
               f"verdict **{g.get('verdict')}** after {g.get('reclaim_ms', float('nan')):.2f} ms; next stage {lg['stages'][1]['status']}.")
    summary["leak_grandchild"] = {"exit": text("leak-grandchild.exit"), "stage": s, "next_status": lg["stages"][1]["status"]}
if lo:
    s = lo["stages"][0]
    g = gpu0(s) or {}
    holder = text("outside-holder.pid", "?")
    out.append(f"- Process outside the stage's tree (pid {holder}) ({text('leak-outside.exit')}, run {lo['status']}): verdict **{g.get('verdict')}**, "
               f"{(g.get('after_bytes', 0) - g.get('baseline_bytes', 0)) / MIB:.0f} MiB above baseline after {g.get('reclaim_ms', float('nan')):.0f} ms, "
               f"holders {g.get('holders')}; next stage {lo['stages'][1]['status']} ({lo['stages'][1].get('error')}).")
    summary["leak_outside"] = {"exit": text("leak-outside.exit"), "holder_pid": holder, "stage": s, "next": lo["stages"][1]}
out.append("")
with open(os.path.join(W, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print("\n".join(out))
