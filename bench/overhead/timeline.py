#!/usr/bin/env python3
"""A stage's wall in three stretches, from the kernel's own timestamps, against the loop's.

    bench/overhead/timeline.py --bin LABEL=PATH [--bin LABEL=PATH ...] [--stages N]
                               [--reps R] [--run-base DIR] [--env LABEL=VAR=VALUE ...] --out FILE

For every binary (and the `subprocess.run(["true"])` loop) it runs N chained `true` stages
under `perf record -a -e sched:sched_process_{fork,exec,exit}` and splits each stage's wall
into the stretches the scheduler's tracepoints bound:

- `fork_to_exec`: the clone (the tracepoint fires as the new task is woken) to the new
  program's `execve` having loaded it: the parent's clone, the child's work before `execve`
  (its cgroup, session, descriptors) and the kernel's exec up to the program's first
  instruction (the descriptors closed on exec included);
- `exec_to_exit`: `true` itself, the same work in every form;
- `exit_to_next_fork`: the stage's exit (its address space torn down) to the next clone:
  the reap and everything the parent does between two stages.

Per form and repetition: the mean, median, 90th and 99th percentiles of each stretch and the
wall per stage (first clone to last, over the stages between). The forms alternate within
each repetition (in the order given, the loop last). Tracing slows every form a little, the
same way: compare stretches side by side, not these walls with `bench.py`'s. `--env`
sets a variable for one form's runs (e.g. `new=ORCHESTRATE_CGROUPS=0` for a run without a
cgroup per stage; repeat `--bin` with another label to run a binary both ways).
Needs `perf` with access to the scheduler's tracepoints (root, or `perf_event_paranoid` ≤ -1).
"""
import argparse, json, os, platform, re, shutil, statistics, subprocess, sys, tempfile, time

from chain_plan import write_chain_plan
from sched_events import LINE, record

EVENTS = "sched:sched_process_fork,sched:sched_process_exec,sched:sched_process_exit"
LOOP = "import subprocess, sys\nfor _ in range(int(sys.argv[1])): subprocess.run(['true'])\n"


def stretches(script, parent):
    """The three stretches of every `true` stage whose clone was made by a process whose name
    starts with `parent`, in microseconds, and the wall per stage."""
    fork, execd, exited = {}, {}, {}
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        comm, tid, t, event, trace = m.groups()
        t = float(t)
        if event.endswith("fork") and comm.startswith(parent):
            fork[int(re.search(r"child_pid=(\d+)", trace).group(1))] = t
        elif event.endswith("exec") and re.search(r"filename=(\S*/)?true ", trace):
            execd[int(re.search(r" pid=(\d+)", trace).group(1))] = t
        elif event.endswith("exit") and comm == "true":
            exited[int(tid)] = t
    pids = sorted((p for p in fork if p in execd and p in exited), key=fork.get)
    us = lambda s: s * 1e6
    out = {
        "fork_to_exec": [us(execd[p] - fork[p]) for p in pids],
        "exec_to_exit": [us(exited[p] - execd[p]) for p in pids],
        "exit_to_next_fork": [us(fork[b] - exited[a]) for a, b in zip(pids, pids[1:])],
    }
    wall = us(fork[pids[-1]] - fork[pids[0]]) / (len(pids) - 1)
    return len(pids), out, wall


def summary(values):
    s = sorted(values)
    q = lambda p: s[int(p * (len(s) - 1))]
    return {"mean": round(statistics.fmean(s), 1), "median": round(statistics.median(s), 1),
            "p90": round(q(0.9), 1), "p99": round(q(0.99), 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True, help="LABEL=PATH")
    ap.add_argument("--env", action="append", default=[], help="LABEL=VAR=VALUE")
    ap.add_argument("--stages", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--run-base", default="/dev/shm")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("timeline.py needs perf")
    forms = [tuple(b.split("=", 1)) for b in args.bin]
    extra = {}
    for e in args.env:
        label, assignment = e.split("=", 1)
        var, value = assignment.split("=", 1)
        extra.setdefault(label, {})[var] = value
    work = tempfile.mkdtemp(prefix="timeline-", dir=args.run_base)
    plan = os.path.join(work, "chain.toml")
    write_chain_plan(args.stages, plan)
    loop = os.path.join(work, "loop.py")
    with open(loop, "w") as f:
        f.write(LOOP)
    results = {label: [] for label, _ in forms}
    results["subprocess_run_loop"] = []
    try:
        for rep in range(args.reps):
            for label, path in forms + [("subprocess_run_loop", None)]:
                env = dict(os.environ, **extra.get(label, {}))
                data = os.path.join(work, "perf.data")
                if path is None:
                    script = record([sys.executable, loop, str(args.stages)], EVENTS, data, env)
                    parent = "python"
                else:
                    run_dir = os.path.join(work, f"run-{label}-{rep}")
                    script = record([os.path.abspath(path), "--plan", plan, "--run-dir", run_dir,
                                     "-q"], EVENTS, data, env)
                    parent = os.path.basename(path)[:15]
                    shutil.rmtree(run_dir, ignore_errors=True)
                n, parts, wall = stretches(script, parent)
                row = {"stages_seen": n, "wall_us_per_stage": round(wall, 1)}
                row.update({k: summary(v) for k, v in parts.items()})
                results[label].append(row)
                print(f"rep {rep + 1}/{args.reps} {label}: {wall:.0f} us/stage, "
                      + ", ".join(f"{k} median {row[k]['median']}" for k in parts), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count()},
        "commit": commit,
        "what": f"{args.stages} chained `true` stages per form, {args.reps} repetitions, forms "
                "alternating; stretches from sched_process_{fork,exec,exit} (perf -a), microseconds",
        "forms": {label: path for label, path in forms},
        "env": extra,
        "load_average_at_start": os.getloadavg(),
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
