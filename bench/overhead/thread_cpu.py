#!/usr/bin/env python3
"""The scheduling thread's own CPU per stage, beside the Python loop's own CPU per iteration.

    bench/overhead/thread_cpu.py --bin LABEL=PATH [--bin LABEL=PATH ...] [--stages N]
                                 [--reps R] [--run-base DIR] [--out FILE]

Runs N chained `true` stages (`s{i}` after `s{i-1}`) with each binary and a
`subprocess.run(["true"])` loop of N iterations, alternating, R times. For `orchestrate` it
reads every thread's run time (`/proc/<pid>/task/<tid>/schedstat`, nanoseconds on a CPU)
every 20 ms while the run lasts and keeps the last reading per thread: the whole run but
its last few milliseconds, divided by N. For the loop it takes `os.times()` around it (the
interpreter's own user + system time; the children's excluded). The run directories go in
RUN_BASE (default /dev/shm: the disk is left out of it) and are removed after each run.
"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, time

from chain_plan import write_chain_plan


def run_orchestrate(binary, plan, run_dir, n):
    proc = subprocess.Popen([binary, "--plan", plan, "--run-dir", run_dir, "-q"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = {}
    while proc.poll() is None:
        try:
            tids = os.listdir(f"/proc/{proc.pid}/task")
        except OSError:
            break
        for tid in tids:
            try:
                with open(f"/proc/{proc.pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{proc.pid}/task/{tid}/schedstat") as f:
                    ns = int(f.read().split()[0])
            except OSError:
                continue
            # The first thread is the scheduling thread (its name is the binary's).
            key = "scheduling" if tid == str(proc.pid) else name
            last[key] = ns
        time.sleep(0.02)
    if proc.wait() != 0:
        sys.exit(f"{binary} failed")
    shutil.rmtree(run_dir)
    return {k: v / 1e3 / n for k, v in last.items()}


def run_loop(n):
    before = os.times()
    for _ in range(n):
        subprocess.run(["true"])
    after = os.times()
    return (after.user - before.user + after.system - before.system) * 1e6 / n


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", action="append", required=True, help="LABEL=PATH")
    ap.add_argument("--stages", type=int, default=5000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--run-base", default="/dev/shm")
    ap.add_argument("--out")
    args = ap.parse_args()
    bins = [b.split("=", 1) for b in args.bin]
    base = os.path.join(args.run_base, f"thread-cpu-{os.getpid()}")
    os.makedirs(base)
    plan = os.path.join(base, "plan.toml")
    write_chain_plan(args.stages, plan)
    loop, per_bin = [], {label: [] for label, _ in bins}
    for rep in range(args.reps):
        loop.append(run_loop(args.stages))
        line = [f"loop {loop[-1]:.0f} us"]
        for label, path in bins:
            threads = run_orchestrate(path, plan, os.path.join(base, f"run-{label}-{rep}"),
                                      args.stages)
            per_bin[label].append(threads)
            line.append(f"{label}: " + ", ".join(f"{k} {v:.0f} us" for k, v in threads.items()))
        print(f"rep {rep + 1}/{args.reps}: " + "; ".join(line), file=sys.stderr)
    shutil.rmtree(base)
    result = {
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs "
                   f"Linux {platform.release()}",
        "what": f"CPU per stage, microseconds: {args.stages} chained `true` stages, run "
                f"directories in {args.run_base}; `subprocess_run_loop` is the Python loop's "
                "own CPU per iteration",
        "binaries": {label: path for label, path in bins},
        "subprocess_run_loop_us": spread(loop),
        "orchestrate_us": {
            label: {thread: spread([r[thread] for r in runs if thread in r])
                    for thread in runs[0]}
            for label, runs in per_bin.items()
        },
        "reps": {"loop": loop, **per_bin},
    }
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
