#!/usr/bin/env python3
"""A run's fixed costs, from the kernel's own timestamps: its start and its end, which a
one-at-a-time loop does not have.

    bench/overhead/run_ends.py --bin LABEL=PATH [--bin LABEL=PATH ...] [--sizes 1000,20000]
                               [--reps R] [--run-base DIR] --out FILE

For every size, a chain of that many `true` stages (chain_plan.py) is run by each binary in
turn (the order reversed every other repetition) under `perf record -a -e
sched:sched_process_{exec,exit}`:

- `start_ms`: `orchestrate`'s `execve` to the first stage's `execve`;
- `end_ms`: the last stage's exit to `orchestrate`'s exit;
- `validate_s`: the wall of `orchestrate validate` on the same plan, just before the run
  (the plan read, decoded and checked; nothing run).

Needs `perf` with access to the scheduler's tracepoints (root, or `perf_event_paranoid` <= -1).
"""
import argparse, json, os, platform, re, shutil, subprocess, sys, tempfile, time

from chain_plan import write_chain_plan
from sched_events import LINE, record

EVENTS = "sched:sched_process_exec,sched:sched_process_exit"


def ends(binary, plan, run_dir, data):
    name = os.path.basename(binary)[:15]  # the kernel keeps 15 characters of a command name
    script = record([binary, "--plan", plan, "--run-dir", run_dir, "-q"], EVENTS, data)
    started = first = last_exit = ended = None
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        comm, _, t, event, trace = m.groups()
        t = float(t)
        if event.endswith("exec"):
            if started is None and f"/{os.path.basename(binary)} " in trace + " ":
                started = t
            elif first is None and re.search(r"filename=(\S*/)?true ", trace):
                first = t
        elif event.endswith("exit"):
            if comm == "true":
                last_exit = t
            elif comm == name:
                ended = t
    return {"start_ms": (first - started) * 1e3, "end_ms": (ended - last_exit) * 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", action="append", required=True, help="LABEL=PATH")
    ap.add_argument("--sizes", default="1000,20000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--run-base", default="/dev/shm")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    bins = [tuple(b.split("=", 1)) for b in args.bin]
    work = tempfile.mkdtemp(prefix="run-ends-", dir=args.run_base)
    results = {}
    try:
        for n in [int(s) for s in args.sizes.split(",")]:
            plan = os.path.join(work, f"chain-{n}.toml")
            write_chain_plan(n, plan, header='[run]\nname = "chain-explicit"\n')
            results[n] = {label: [] for label, _ in bins}
            for rep in range(args.reps):
                for label, binary in (bins if rep % 2 == 0 else bins[::-1]):
                    t0 = time.perf_counter()
                    subprocess.run([binary, "validate", plan], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, check=True)
                    validate_s = time.perf_counter() - t0
                    run_dir = os.path.join(work, f"run-{label}-{n}-{rep}")
                    row = ends(binary, plan, run_dir, os.path.join(work, "perf.data"))
                    row["validate_s"] = validate_s
                    results[n][label].append(row)
                    shutil.rmtree(run_dir, ignore_errors=True)
                    print(f"{n}: rep {rep + 1}/{args.reps} {label}: start {row['start_ms']:.1f} ms, "
                          f"end {row['end_ms']:.1f} ms, validate {validate_s:.3f} s", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
                   f"Linux {platform.release()}",
        "what": __doc__.split("\n\n")[2].strip(),
        "bins": dict(bins),
        "run_base": args.run_base,
        "results": results,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
