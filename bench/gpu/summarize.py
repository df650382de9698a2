#!/usr/bin/env python3
"""Turns the GPU benchmark's run directories (argv[1]) into summary.md (stdout) and
summary.json (in the same directory). Every figure comes from the reports and journals the
runs wrote; nothing is typed in."""
import json, os, statistics, sys

W = sys.argv[1]
MIB = 2**20
summary = {}


def load(path):
    try:
        with open(os.path.join(W, path)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def exit_of(name):
    try:
        return open(os.path.join(W, f"{name}.exit")).read().strip()
    except OSError:
        return "missing"


def pct(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


out = []
out.append("# GPU benchmark results\n")
out.append("```\n" + open(os.path.join(W, "machine.txt")).read().strip() + "\n```\n")

# Quickstart
qs = load("quickstart/report.json")
if qs:
    out.append(f"## Quickstart on the GPU ({exit_of('quickstart')}, run {qs['status']}, {qs['wall_s']:.1f} s)\n")
    out.append("| stage | status | wall s | tokens/s | final loss | accuracy | GPU after − baseline MiB | reclaim ms | verdict |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for s in qs["stages"]:
        m = s["metrics"]
        g = s["gpu"][0] if s["gpu"] else None
        row = {
            "stage": s["name"], "status": s["status"], "wall_s": s["wall_s"],
            "tokens_per_s": m.get("tokens_per_s"), "final_loss": m.get("final_loss", m.get("loss")),
            "accuracy": m.get("accuracy"),
            "after_minus_baseline_mib": (g["after_bytes"] - g["baseline_bytes"]) / MIB if g else None,
            "reclaim_ms": g["reclaim_ms"] if g else None, "verdict": g["verdict"] if g else None,
        }
        rows.append(row)
        fmt = lambda v, f: "-" if v is None else format(v, f)
        out.append(f"| {row['stage']} | {row['status']} | {fmt(row['wall_s'], '.2f')} | {fmt(row['tokens_per_s'], '.0f')} | "
                   f"{fmt(row['final_loss'], '.4f')} | {fmt(row['accuracy'], '.3f')} | {fmt(row['after_minus_baseline_mib'], '.0f')} | "
                   f"{fmt(row['reclaim_ms'], '.2f')} | {row['verdict'] or '-'} |")
    summary["quickstart"] = rows
    out.append("")

# Headline
py = load("one_process.json")
five = load("five/report.json")
if py and five:
    orch_after = [s["gpu"][0]["after_bytes"] / MIB if s["gpu"] else None for s in five["stages"]]
    orch_base = five["stages"][0]["gpu"][0]["baseline_bytes"] / MIB if five["stages"][0]["gpu"] else None
    out.append("## Headline: device memory after each of 5 training stages\n")
    out.append(f"One Python process (PyTorch eager, stray reference kept, seeds' cleanup) started at "
               f"{py['before_mib']:.0f} MiB; orchestrate's first baseline was {orch_base:.0f} MiB "
               f"({exit_of('five')}).\n")
    out.append("| after stage | one Python process, MiB | orchestrate, MiB |")
    out.append("|---|---|---|")
    for i, (a, b) in enumerate(zip(py["after_stage_mib"], orch_after), 1):
        out.append(f"| {i} | {a:.0f} | {b:.0f} |")
    out.append("")
    out.append("| stage | Python tokens/s | stage-worker tokens/s |")
    out.append("|---|---|---|")
    for i, (a, s) in enumerate(zip(py["tokens_per_s"], five["stages"]), 1):
        out.append(f"| {i} | {a:.0f} | {s['metrics'].get('tokens_per_s', float('nan')):.0f} |")
    out.append("")
    summary["headline"] = {"python_before_mib": py["before_mib"], "python_after_mib": py["after_stage_mib"],
                           "orchestrate_baseline_mib": orch_base, "orchestrate_after_mib": orch_after,
                           "python_tokens_per_s": py["tokens_per_s"],
                           "orchestrate_tokens_per_s": [s["metrics"].get("tokens_per_s") for s in five["stages"]]}

# Reclaim
rec = load("reclaim/report.json")
if rec:
    out.append(f"## Reclaim time after the worker's exit ({exit_of('reclaim')})\n")
    out.append("Time from the stage's last process gone to the first NVML reading back at baseline.\n")
    out.append("| allocation | n | median ms | max ms | verdicts |")
    out.append("|---|---|---|---|---|")
    summary["reclaim"] = {}
    for gib in (1, 8, 64):
        st = [s for s in rec["stages"] if s["name"].startswith(f"hold-{gib}gib-") and s["gpu"]]
        ms = [s["gpu"][0]["reclaim_ms"] for s in st]
        peaks = [(s["gpu"][0]["peak_bytes"] - s["gpu"][0]["baseline_bytes"]) / 2**30 for s in st]
        verdicts = sorted({s["gpu"][0]["verdict"] for s in st})
        if ms:
            out.append(f"| {gib} GiB (peak seen {statistics.median(peaks):.1f} GiB) | {len(ms)} | {statistics.median(ms):.3f} | {max(ms):.3f} | {', '.join(verdicts)} |")
            summary["reclaim"][f"{gib}GiB"] = {"n": len(ms), "median_ms": statistics.median(ms), "max_ms": max(ms), "verdicts": verdicts}
    out.append("")

# Handoff
ho = load("handoff/report.json")
if ho:
    st = [s for s in ho["stages"] if s.get("timing")]
    handoff = [(b["timing"]["spawned"] - a["timing"]["exited"]) * 1e3 for a, b in zip(st, st[1:])]
    verify = [(s["timing"]["verified"] - s["timing"]["exited"]) * 1e3 for s in st]
    out.append(f"## Handoff between consecutive GPU stages ({exit_of('handoff')})\n")
    out.append("Worker exit collected → tree checked gone → NVML verdict clean → next worker spawned.\n")
    out.append("| measure | n | median ms | p95 ms | max ms |")
    out.append("|---|---|---|---|---|")
    out.append(f"| exit → next spawn | {len(handoff)} | {statistics.median(handoff):.3f} | {pct(handoff, .95):.3f} | {max(handoff):.3f} |")
    out.append(f"| exit → verified clean | {len(verify)} | {statistics.median(verify):.3f} | {pct(verify, .95):.3f} | {max(verify):.3f} |")
    out.append("")
    summary["handoff"] = {"exit_to_next_spawn_ms": handoff, "exit_to_verified_ms": verify}

# Seed 001's loop
sw = load("sweep20/report.json")
py20 = load("one_process20.json")
if sw:
    inst = [s for s in sw["stages"] if s["gpu"]]
    after = [(s["name"], s["gpu"][0]["after_bytes"] / MIB, s["gpu"][0]["baseline_bytes"] / MIB, s["gpu"][0]["verdict"]) for s in inst]
    ft = [a for a in after if a[0].startswith("finetune[")]
    out.append(f"## Seed 001's loop: fine-tune + eval per sample, 20 samples ({exit_of('sweep20')}, run {sw['status']}, {sw['wall_s']:.1f} s)\n")
    out.append(f"Under orchestrate: {len(inst)} stages on the GPU, verdicts: {sorted({a[3] for a in after})}; device memory after every stage: "
               f"min {min(a[1] for a in after):.0f} MiB, max {max(a[1] for a in after):.0f} MiB (baselines {min(a[2] for a in after):.0f}–{max(a[2] for a in after):.0f} MiB).\n")
    if py20:
        out.append("| after sample | one Python process (references kept), MiB | orchestrate, after fine-tune, MiB |")
        out.append("|---|---|---|")
        for k, (a, b) in enumerate(zip(py20["after_stage_mib"], ft), 1):
            out.append(f"| {k} | {a:.0f} | {b[1]:.0f} |")
        out.append("")
    summary["sweep20"] = {"exit": exit_of("sweep20"), "after_mib": after, "python_after_mib": py20["after_stage_mib"] if py20 else None}
s0 = load("seed000/report.json")
if s0:
    out.append(f"## Seed 000 with Accelerate as two stages ({exit_of('seed000')}, run {s0['status']})\n")
    out.append("| stage | status | wall s | first loss | final loss | GPU after − baseline MiB | reclaim ms | verdict |")
    out.append("|---|---|---|---|---|---|---|---|")
    for s in s0["stages"]:
        g = s["gpu"][0] if s["gpu"] else {}
        m = s["metrics"]
        out.append(f"| {s['name']} | {s['status']} | {s['wall_s'] or 0:.1f} | {m.get('first_loss', float('nan')):.3f} | {m.get('final_loss', float('nan')):.3f} | "
                   f"{(g.get('after_bytes', 0) - g.get('baseline_bytes', 0)) / MIB:.0f} | {g.get('reclaim_ms', float('nan')):.2f} | {g.get('verdict')} |")
    out.append("")
    summary["seed000"] = {"exit": exit_of("seed000"), "stages": s0["stages"]}

# Leak fixtures
lg = load("leak-grandchild/report.json")
lo = load("leak-outside/report.json")
if lg or lo:
    out.append("## Leak fixtures\n")
if lg:
    s = lg["stages"][0]
    g = s["gpu"][0] if s["gpu"] else {}
    out.append(f"- GPU-holding grandchild ({exit_of('leak-grandchild')}): stage `{s['name']}` {s['status']}; "
               f"leftover processes stopped: {s['leftover_processes']}; peak {(g.get('peak_bytes', 0) - g.get('baseline_bytes', 0)) / MIB:.0f} MiB above baseline; "
               f"verdict **{g.get('verdict')}** after {g.get('reclaim_ms', float('nan')):.2f} ms; next stage {lg['stages'][1]['status']}.")
    summary["leak_grandchild"] = {"exit": exit_of("leak-grandchild"), "stage": s}
if lo:
    s = lo["stages"][0]
    g = s["gpu"][0] if s["gpu"] else {}
    try:
        holder = open(os.path.join(W, "outside-holder.pid")).read().strip()
    except OSError:
        holder = "?"
    out.append(f"- Process outside the stage's tree (pid {holder}) ({exit_of('leak-outside')}, run {lo['status']}): verdict **{g.get('verdict')}**, "
               f"{(g.get('after_bytes', 0) - g.get('baseline_bytes', 0)) / MIB:.0f} MiB above baseline after {g.get('reclaim_ms', float('nan')):.0f} ms, "
               f"holders {g.get('holders')}; next stage {lo['stages'][1]['status']} ({lo['stages'][1].get('error')}).")
    summary["leak_outside"] = {"exit": exit_of("leak-outside"), "holder_pid": holder, "stage": s, "next": lo["stages"][1]}
out.append("")
with open(os.path.join(W, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print("\n".join(out))
