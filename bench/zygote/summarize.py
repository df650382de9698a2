"""Summarizes bench/zygote/run.sh's runs: spawn → first line of user code per stage, and seed
001's per-instance wall (spawn to GPU verdict), through the zygote and exec'd (median and range), with the path each
stage took (report.json `start`)."""
import json
import os
import statistics
import sys

res = sys.argv[1]


def report(name):
    try:
        return json.load(open(os.path.join(res, name, "report.json")))
    except OSError as error:
        print(f"{name}: no report ({error})")
        return {"stages": []}


def spread(values):
    if not values:
        return "no samples"
    return "median %.3f s, range %.3f–%.3f s, n=%d" % (statistics.median(values), min(values), max(values), len(values))


for run in ["run-first-zygote", "run-first-exec"]:
    firsts = []
    for stage in report(run)["stages"]:
        log = os.path.join(res, run, "stages", stage["name"], "stdout.log")
        try:
            lines = open(log).read().split("\n")
            first = float(lines[0].split()[0]) - stage["timing"]["spawned"]
            cuda = float(lines[1].split()[0]) - stage["timing"]["spawned"]
        except (OSError, ValueError, IndexError, KeyError, TypeError) as error:
            print(f"{run} {stage['name']}: {stage['status']} ({error})")
            continue
        print("%s %s: %s, first line %.3f s, first CUDA result %.3f s after spawn, start %s, gpu %s" % (
            run, stage["name"], stage["status"], first, cuda, json.dumps(stage.get("start")),
            [g["verdict"] for g in stage.get("gpu", [])]))
        if not (run == "run-first-zygote" and stage["name"] == "s1"):
            firsts.append(first)
    print(f"{run}: first line of user code, spawn to it: {spread(firsts)}")

for run in ["run-seed-zygote", "run-seed-exec"]:
    walls = {"finetune": [], "eval": []}
    for n, stage in enumerate(report(run)["stages"]):
        kind = stage["name"].split("[")[0]
        # From before the spawn (a zygote's first stage waits for the zygote's imports there)
        # to the GPU verdict.
        t = stage.get("timing") or {}
        wall = (t.get("verified") or 0) - (t.get("spawned") or 0)
        print("%s %s: %s, spawn to verdict %.2f s (wall_s %.2f), start %s, gpu %s" % (
            run, stage["name"], stage["status"], wall, stage.get("wall_s") or 0, json.dumps(stage.get("start")),
            [(g["verdict"], g["after_bytes"] >> 20) for g in stage.get("gpu", [])]))
        walls[kind].append(wall)
    for kind, values in walls.items():
        print(f"{run} {kind} per-instance wall: {spread(values)}")
