"""Summarizes bench/zygote/run.sh's runs: spawn → first line of user code per stage, and seed
001's per-instance wall (spawn to GPU verdict), through the zygote and exec'd (median and range), with the path each
stage took (report.json `start`); and the learning sweeps (run-learn-*): per stage, spawn to
first line, the generation of the zygote it was forked from and what it still imported."""
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
    if not os.path.isdir(os.path.join(res, run)):
        continue
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
    if not os.path.isdir(os.path.join(res, run)):
        continue
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


def described(start):
    """A stage's path in a few words: `zygote g2 (imported 12: a, b, c)`, or `exec: why`."""
    if not start:
        return "no start recorded"
    if start.get("via") != "zygote":
        return "exec: " + (start.get("fallback") or "")[:90]
    imported = start.get("imported") or {}
    words = "zygote g%s (imported %s: %s)" % (start.get("generation"), imported.get("count", "?"),
                                             ", ".join(imported.get("first", [])[:3]))
    if start.get("left_out"):
        words += ", left out: " + ", ".join(m["module"] for m in start["left_out"])
    return words


for sweep in ["list", "list-again", "auto", "auto-again", "exec"]:
    run = "run-learn-" + sweep
    if not os.path.isdir(os.path.join(res, run)):
        continue
    firsts, after_first, forked_last = [], [], []
    stages = report(run)["stages"]
    last_generation = max([(s.get("start") or {}).get("generation") or 0 for s in stages] or [0])
    for n, stage in enumerate(stages):
        log = os.path.join(res, run, "stages", stage["name"], "stdout.log")
        start = stage.get("start") or {}
        try:
            first = float(open(log).read().split()[0]) - stage["timing"]["spawned"]
        except (OSError, ValueError, IndexError, KeyError, TypeError) as error:
            print(f"{run} {stage['name']}: {stage['status']} ({error})")
            continue
        print("%s %s: %s, first line %.3f s after spawn, %s" % (run, stage["name"], stage["status"], first, described(start)))
        firsts.append(first)
        if n > 0:
            after_first.append(first)
        if last_generation and start.get("generation") == last_generation:
            forked_last.append(first)
    print(f"{run}: spawn to first line, every stage: {spread(firsts)}")
    print(f"{run}: spawn to first line, stages 2 on: {spread(after_first)}")
    if forked_last:
        print(f"{run}: spawn to first line, forked from generation {last_generation}: {spread(forked_last)}")
