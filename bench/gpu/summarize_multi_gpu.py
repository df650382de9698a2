"""Aggregate the repetitions of multi_gpu_reps.sh: OUT/rep*/summary.json -> OUT/summary.{json,md}.

Every figure is given as median (min-max) over the repetitions that finished, with n; checks
(statuses, verdicts, the foreign holder) are listed per repetition.
"""
import json
import os
import statistics
import sys

out, samples = sys.argv[1], int(sys.argv[2])
reps = []
for name in sorted(os.listdir(out)):
    path = os.path.join(out, name, "summary.json")
    if name.startswith("rep") and os.path.exists(path):
        try:
            reps.append((name, json.load(open(path))))
        except ValueError:
            pass


def spread(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(s, unit="", digits=1):
    if s is None:
        return "n/a"
    f = f"{{:.{digits}f}}"
    return f"{f.format(s['median'])}{unit} ({f.format(s['min'])}–{f.format(s['max'])}), n = {s['n']}"


agg = {"samples": samples, "repetitions": [n for n, _ in reps],
       "machine": {n: r["machine"] for n, r in reps}}
agg["sweep_all_wall_s"] = spread([r["sweep-all"]["wall_s"] for _, r in reps])
agg["sweep_one_wall_s"] = spread([r["sweep-one"]["wall_s"] for _, r in reps])
agg["speedup_all_vs_one"] = spread([r["speedup_all_vs_one"] for _, r in reps])
agg["reclaim_ms_max"] = spread([max(r["sweep-all"]["reclaim_ms_max"], r["sweep-one"]["reclaim_ms_max"]) for _, r in reps])
agg["after_minus_baseline_mib_max"] = max((max(r["sweep-all"]["after_minus_baseline_mib_max"],
                                               r["sweep-one"]["after_minus_baseline_mib_max"]) for _, r in reps), default=None)
# Per GPU index: runs before the NVML-handle fix of one_process_stages.py read GPU 0 from every
# process, so only "gpu0" is trustworthy there (see the results' README).
growth = {}
for _, r in reps:
    for name, g in r["one_python_process_per_gpu"].items():
        if "after_stage_mib" in g:
            growth.setdefault(name, []).append(g["after_stage_mib"][-1] - g["before_mib"])
agg["python_growth_mib"] = {name: spread(v) for name, v in sorted(growth.items())}
checks = []
for n, r in reps:
    checks.append({
        "rep": n, "exits": r["exits"],
        "sweep_all": [r["sweep-all"]["status"], r["sweep-all"]["stages"], r["sweep-all"]["verdicts"], r["sweep-all"]["stages_per_gpu"]],
        "sweep_one": [r["sweep-one"]["status"], r["sweep-one"]["stages"], r["sweep-one"]["verdicts"]],
        "ddp": [r["ddp"]["status"], [(g["uuid"][:12], g["verdict"]) for g in r["ddp"]["gpu"]]],
        "foreign": [r["foreign"]["status"], r["foreign"]["verdicts"], r["foreign"]["stages_started_on_gpu0_while_held"],
                    r["foreign"]["reason_names_holder"]],
    })
agg["checks"] = checks
json.dump(agg, open(os.path.join(out, "summary.json"), "w"), indent=1)

lines = [f"# multi_gpu_reps.sh: {samples} samples, {len(reps)} repetitions", ""]
for n, m in agg["machine"].items():
    lines.append(f"- {n}: " + "; ".join(m))
lines += ["", "| figure | median (min–max), n |", "|---|---|",
          f"| sweep on all GPUs, wall | {fmt(agg['sweep_all_wall_s'], ' s')} |",
          f"| same sweep one stage at a time, wall | {fmt(agg['sweep_one_wall_s'], ' s')} |",
          f"| speed-up, all GPUs vs one at a time (per repetition) | {fmt(agg['speedup_all_vs_one'], '×', 2)} |",
          f"| slowest reclaim in a repetition | {fmt(agg['reclaim_ms_max'], ' ms', 2)} |",
          *[f"| one Python process per GPU ({name}): growth over its samples | {fmt(v, ' MiB', 0)} |"
            for name, v in agg["python_growth_mib"].items()],
          f"| most MiB above baseline after any sweep stage | {agg['after_minus_baseline_mib_max']} |",
          "", "Checks per repetition:", ""]
for c in checks:
    lines.append(f"- {c['rep']}: exits {c['exits']}; all GPUs {c['sweep_all']}; one at a time {c['sweep_one']}; "
                 f"DDP {c['ddp']}; foreign holder {c['foreign']}")
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
