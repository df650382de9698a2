#!/usr/bin/env python3
"""Summarises results.json of bench.py: tokens/s per shape and variant (median, range, runs)
and each against the torch.compile peer of the same run."""
import json, statistics, sys

r = json.load(open(sys.argv[1]))
runs = [x for x in r["runs"] if not x.get("profiled") and x.get("tokens_per_s")]
print("| shape | who | variant | runs | tokens/s median (min–max) | vs eager | vs compile | first step (s) |")
print("|---|---|---|---|---|---|---|---|")
for shape in r["shapes"]:
    rows = [x for x in runs if x["shape"] == shape]
    med = {}
    keys = []
    for x in rows:
        k = (x["who"], x["variant"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        med[k] = statistics.median(x["tokens_per_s"] for x in rows if (x["who"], x["variant"]) == k)
    eager = med.get(("pytorch-eager", "eager"))
    comp = med.get(("pytorch-compile", "compile"))
    for k in keys:
        v = [x["tokens_per_s"] for x in rows if (x["who"], x["variant"]) == k]
        first = [x.get("first_step_s") for x in rows if (x["who"], x["variant"]) == k and x.get("first_step_s")]
        ratio = lambda peer: f"{med[k] / peer:.3f}" if peer else "—"
        fs = f"{statistics.median(first):.3f}" if first else "—"
        print(f"| {shape} | {k[0]} | {k[1]} | {len(v)} | {med[k]:,.0f} ({min(v):,.0f}–{max(v):,.0f}) "
              f"| {ratio(eager)} | {ratio(comp)} | {fs} |")
failed = [x for x in r["runs"] if not x.get("tokens_per_s")]
if failed:
    print(f"\n{len(failed)} run(s) gave no figure: " + "; ".join(f"{x['shape']} {x['who']} {x['variant']}: {str(x.get('error') or x.get('stderr'))[:200]}" for x in failed))
