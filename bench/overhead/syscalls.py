#!/usr/bin/env python3
"""System calls on the path between two stages, counted and priced.

    bench/overhead/syscalls.py --bin LABEL=PATH [--bin LABEL=PATH ...] [--stages N] --out FILE

1. The scheduling thread's system calls per stage: `strace` (without -f: the process's first
   thread only, which is `orchestrate`'s scheduling thread) over N chained `true` stages in
   /dev/shm, counted between the 10th and the (N-10)th `clone3`/`clone`, by name; the same for
   the Python `subprocess.run(["true"])` loop (its `vfork`s). Counts, not times: strace slows
   every call, not which calls there are.
   With --threads, a second run under `strace -f` counts every other thread of `orchestrate`
   (the preparer `stage-files`, the journal's group commit, ...) over the whole run, per stage
   (the stages' own processes, which `execve`, are left out). Each thread slows under strace,
   so the split between threads can differ from an untraced run; the kinds of calls do not.
2. What single calls cost (syscall_costs.c, compiled with cc, warm caches, 20,000 iterations;
   the file ones on ext4 in the system's temporary directory and on /dev/shm).
"""
import argparse, collections, json, os, platform, re, subprocess, sys, tempfile, time

from chain_plan import write_chain_plan

HERE = os.path.dirname(os.path.abspath(__file__))


def per_stage(trace, spawn_names, n):
    calls = [m.group(1) for m in (re.match(r"(\w+)\(", line) for line in open(trace)) if m]
    spawns = [k for k, c in enumerate(calls) if c in spawn_names]
    lo, hi = spawns[10], spawns[n - 10]
    counts = collections.Counter(calls[lo:hi])
    stages = n - 20
    return {"per_stage_total": round((hi - lo) / stages, 2),
            "per_stage": {k: round(v / stages, 2) for k, v in counts.most_common()}}


def other_threads(trace, n):
    """System calls per stage of every thread but the first of the traced process (`strace -f`
    output), by thread name order of appearance and call; pids that `execve` are stages."""
    pat = re.compile(r"^(\d+) +(\w+)\(")
    lines = open(trace).read().splitlines()
    first = lines[0].split()[0]
    stages = {line.split()[0] for line in lines if " execve(" in line}
    counts = collections.Counter()
    for line in lines:
        m = pat.match(line)
        if m and m.group(1) != first and m.group(1) not in stages:
            counts[(m.group(1), m.group(2))] += 1
    per_thread = collections.Counter()
    for (tid, _), v in counts.items():
        per_thread[tid] += v
    out = {}
    for k, (tid, total) in enumerate(per_thread.most_common()):
        if total < n / 20:
            continue
        calls = {c: round(v / n, 2) for (t, c), v in counts.most_common() if t == tid and v >= n / 20}
        out[f"thread{k + 1}"] = {"per_stage_total": round(total / n, 2), "per_stage": calls}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", action="append", required=True)
    ap.add_argument("--stages", type=int, default=1000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", action="store_true", help="also count the other threads (strace -f)")
    args = ap.parse_args()
    n = args.stages
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
              "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True, cwd=HERE).stdout.strip(),
              "what": f"system calls of the scheduling thread per stage, {n} chained `true` stages "
                      "in /dev/shm (strace, first thread only), and the Python loop's per iteration",
              "binaries": dict(b.split("=", 1) for b in args.bin), "per_stage": {}}
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        plan = os.path.join(d, "chain.toml")
        write_chain_plan(n, plan)
        for label, binary in result["binaries"].items():
            trace = os.path.join(d, f"{label}.strace")
            subprocess.run(["strace", "-o", trace, binary, "--plan", plan, "--run-dir",
                            os.path.join(d, f"run-{label}"), "-q"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            result["per_stage"][label] = per_stage(trace, {"clone3", "clone"}, n)
            if args.threads:
                subprocess.run(["strace", "-f", "-o", trace, binary, "--plan", plan, "--run-dir",
                                os.path.join(d, f"run-{label}-f"), "-q"], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                result.setdefault("other_threads_per_stage", {})[label] = other_threads(trace, n)
        trace = os.path.join(d, "loop.strace")
        subprocess.run(["strace", "-o", trace, sys.executable, "-c",
                        f"import subprocess\nfor _ in range({n}): subprocess.run(['true'])"], check=True)
        result["per_stage"]["subprocess_run_loop"] = per_stage(trace, {"vfork", "clone", "clone3"}, n)
        costs = os.path.join(d, "syscall_costs")
        subprocess.run(["cc", "-O2", "-o", costs, os.path.join(HERE, "syscall_costs.c")], check=True)
        result["single_call_cost_us"] = {}
        for where in [tempfile.gettempdir(), "/dev/shm"]:
            with tempfile.TemporaryDirectory(dir=where) as scratch:
                out = subprocess.run([costs, scratch], capture_output=True, text=True, check=True).stdout
                result["single_call_cost_us"][where] = json.loads("{" + out + "}")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
