#!/usr/bin/env python3
"""Orchestration overhead at sweep scale: no-op command stages (`true`) through `orchestrate`
(journal, report.json, results and every isolation check on) against a bare Python
`subprocess.run(["true"])` loop, measured in the same run, alternating, several repetitions.

Plans (every stage runs `true`; N stages in all):
  chain-explicit  N stages written out, each `after` the previous (N <= 10,000: a written-out
                  100,000-stage TOML costs the TOML parser itself ~300 MB)
  chain           two matrix stages over N/2 values, b[i] after a[i] (seed 001's
                  fine-tune -> evaluate pairs), max_parallel = 1
  independent     one matrix stage over N values, max_parallel = 1
  independent-parallel  the same with max_parallel unset (one per core): does parallel work,
                  so its ratio to the one-at-a-time loop is not like for like
Each orchestrate run is bracketed by two loop runs, one just before and one just after it
(L P1 L P2 L P1 L ...); its ratio is its rate over the loop's rate across those two (twice the
stages over their two walls). Before each timed run (the loop's too) `sync` writes back what
the runs before it left dirty, outside the timing (its seconds are kept as `settle_s`); each run records the kernel's
memory-reclaim counters over its own time (`reclaim`: pages scanned by kswapd and by direct
reclaim, slab objects scanned, kswapd's CPU seconds).
For each: wall from spawn to exit, stages/s, peak RSS (ru_maxrss), the time until the first
stage started (from the journal), and, once per size, `orchestrate validate` wall and RSS.

  bench/overhead/bench.py --bin target/release/orchestrate --sizes 1000:7,10000:5,100000 --reps 3 \
      --out bench/overhead/results-DATE.json      (N:REPS overrides --reps for that size)
  --plans independent,chain   runs only those plans, in that order, in each repetition
  --baseline OLD_BIN          also runs OLD_BIN on every plan of every repetition, right after
                              the new binary (each run bracketed by loop runs as above), and
                              gives each plan's new/old ratio of stages/s in the same run
  --alternate                 with --baseline: the baseline first in every other repetition
"""
import argparse, json, os, platform, statistics, subprocess, sys, tempfile, threading, time

from chain_plan import write_chain_plan


PLAN_NAMES = ("chain-explicit", "chain", "independent", "independent-parallel")


def write_plans(n, d):
    plans = {}
    ids = os.path.join(d, f"ids-{n}.txt")
    with open(ids, "w") as f:
        f.writelines(f"{i}\n" for i in range(n))
    half = os.path.join(d, f"ids-{n // 2}.txt")
    with open(half, "w") as f:
        f.writelines(f"{i}\n" for i in range(n // 2))
    if n <= 10_000:
        p = os.path.join(d, f"chain-explicit-{n}.toml")
        write_chain_plan(n, p, header='[run]\nname = "chain-explicit"\n')
        plans["chain-explicit"] = p
    p = os.path.join(d, f"chain-{n}.toml")
    with open(p, "w") as f:
        f.write('[run]\nname = "chain"\nmax_parallel = 1\n'
                f'[[stage]]\nname = "a"\ncommand = ["true"]\nmatrix = {{ i = {{ lines = "{half}" }} }}\n'
                f'[[stage]]\nname = "b"\ncommand = ["true"]\nafter = ["a"]\nmatrix = {{ i = {{ lines = "{half}" }} }}\n')
    plans["chain"] = p
    for name, extra in [("independent", "max_parallel = 1\n"), ("independent-parallel", "")]:
        p = os.path.join(d, f"{name}-{n}.toml")
        with open(p, "w") as f:
            f.write(f'[run]\nname = "{name}"\n{extra}'
                    f'[[stage]]\nname = "t"\ncommand = ["true"]\nmatrix = {{ i = {{ lines = "{ids}" }} }}\n')
        plans[name] = p
    return plans


def first_start(journal, t0, done, out):
    """Polls the journal for its first stage_started record; notes when it appeared."""
    while not done.is_set():
        try:
            with open(journal, "rb") as f:
                if b'"stage_started"' in f.read(1 << 16):
                    out.append(time.perf_counter() - t0)
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.002)


def run_orchestrate(binary, plan, run_dir, n):
    before = reclaim()
    t0 = time.perf_counter()
    p = subprocess.Popen([binary, "--plan", plan, "--run-dir", run_dir, "-q"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done, seen = threading.Event(), []
    watcher = threading.Thread(target=first_start,
                               args=(os.path.join(run_dir, "journal.jsonl"), t0, done, seen))
    watcher.start()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    watcher.join()
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"orchestrate failed on {plan}: {err[-2000:]}")
    return {"wall_s": wall, "stages_per_s": n / wall, "peak_rss_kib": usage.ru_maxrss,
            "first_stage_started_s": seen[0] if seen else None, "reclaim": reclaim_during(before)}


def run_loop(n):
    before = reclaim()
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(["true"], check=True)
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "stages_per_s": n / wall, "reclaim": reclaim_during(before)}


def validate(binary, plan):
    t0 = time.perf_counter()
    p = subprocess.Popen([binary, "validate", plan], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, plan
    return {"wall_s": time.perf_counter() - t0, "peak_rss_kib": usage.ru_maxrss}


def settle():
    """Writes back what earlier runs left dirty, outside any timing: a 100,000-stage run leaves
    600,000 new inodes, and their write-back would otherwise fall on whichever run comes next.
    Returns the seconds it took."""
    t0 = time.perf_counter()
    os.sync()
    return time.perf_counter() - t0


RECLAIM_COUNTERS = ("pgscan_kswapd", "pgscan_direct", "slabs_scanned", "allocstall_normal")


def reclaim():
    """The kernel's memory-reclaim counters so far (/proc/vmstat) and kswapd's CPU seconds."""
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            key, value = line.split()
            if key in RECLAIM_COUNTERS:
                out[key] = int(value)
    ticks = os.sysconf("SC_CLK_TCK")
    out["kswapd_cpu_s"] = 0.0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if "(kswapd" in stat:
                fields = stat.rsplit(")", 1)[1].split()
                out["kswapd_cpu_s"] += (int(fields[11]) + int(fields[12])) / ticks
    return out


def reclaim_during(before):
    after = reclaim()
    return {k: round(after[k] - before.get(k, 0), 3) for k in after}


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/orchestrate")
    ap.add_argument("--sizes", default="1000,10000,100000",
                    help="comma-separated stage counts, each optionally N:REPS")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run-base", default=None,
                    help="where the plans and run directories go (default: the system's temporary "
                         "directory); e.g. /dev/shm to leave the disk's file system out")
    ap.add_argument("--plans", default=None,
                    help="comma-separated plan names, run in this order in each repetition "
                         "(default: all, in the order above)")
    ap.add_argument("--baseline", default=None,
                    help="an older orchestrate binary run beside --bin on every plan (A/B in one run)")
    ap.add_argument("--alternate", action="store_true",
                    help="with --baseline: the baseline runs first in every other repetition (ABBA), "
                         "so neither binary always follows the other")
    args = ap.parse_args()
    if args.plans:
        unknown = set(args.plans.split(",")) - set(PLAN_NAMES)
        if unknown:
            ap.error(f"--plans: no plan named {', '.join(sorted(unknown))} (plans: {', '.join(PLAN_NAMES)})")
    binary = os.path.abspath(args.bin)
    # The binaries each plan runs with, in this order in every repetition.
    bins = [("", binary)] + ([(" [baseline]", os.path.abspath(args.baseline))] if args.baseline else [])
    def git(*argv):
        # A copy of the tree without its history (the GPU machine's) has no commit to name.
        try:
            return subprocess.run(["git", *argv], capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""
    commit = os.environ.get("BENCH_COMMIT") or git("rev-parse", "--short", "HEAD")
    dirty = "" if os.environ.get("BENCH_COMMIT") else git("status", "--porcelain", "--untracked-files=no")
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "commit": commit + ("+uncommitted" if dirty else ""),
        "what": "no-op `true` stages; orchestrate with journal, report.json, results.csv/json, "
                "process-tree and leftover checks; peer: subprocess.run(['true']) loop, one at a time",
        # Other work on the machine skews a 2-core benchmark: its load when this began and ended.
        "load_average_1_5_15_min_at_start": os.getloadavg(),
        "plans_in_order": args.plans,
        "alternate": args.alternate,
        # Switches both binaries read (ORCHESTRATE_CGROUPS=0: no cgroup per stage), as set.
        "orchestrate_env": {k: v for k, v in sorted(os.environ.items())
                            if k.startswith("ORCHESTRATE_")},
        "baseline": ({"bin": os.path.abspath(args.baseline),
                      "version": subprocess.run([args.baseline, "--version"], capture_output=True,
                                                text=True).stdout.strip()}
                     if args.baseline else None),
        "sizes": {},
    }
    base = args.run_base or tempfile.gettempdir()
    # The file system the run directories live on (each stage creates six inodes there).
    result["run_base"] = {"path": base, "fs": subprocess.run(["stat", "-f", "-c", "%T", base],
                                                             capture_output=True, text=True).stdout.strip()}
    with tempfile.TemporaryDirectory(prefix="overhead-", dir=base) as d:
        for spec in args.sizes.split(","):
            # "N" or "N:REPS" (more repetitions where a run is short and noise is large).
            n, reps = (int(x) for x in spec.split(":")) if ":" in spec else (int(spec), args.reps)
            plans = write_plans(n, d)
            # The names were checked above; `chain-explicit` exists only up to 10,000 stages.
            if args.plans:
                plans = {k: plans[k] for k in args.plans.split(",") if k in plans}
            size = {"validate": {}, "plans": {k + label: [] for k in plans for label, _ in bins},
                    "subprocess_run_loop": [], "settle_s": []}
            for name, plan in plans.items():
                for label, exe in bins:
                    size["validate"][name + label] = validate(exe, plan)
            loops = size["subprocess_run_loop"]
            # Every orchestrate run is bracketed by a loop run just before and one just after
            # (L P1 L P2 L P1 L ...): its ratio is against the loop's rate over those two, so a
            # drift of the machine's speed during the benchmark weighs on both sides alike, and
            # no orchestrate run follows another directly.
            size["settle_s"].append(settle())
            loops.append(run_loop(n))
            for rep in range(reps):
                order = bins[::-1] if args.alternate and rep % 2 else bins
                for (name, plan), (label, exe) in ((p, b) for p in plans.items() for b in order):
                    run_dir = os.path.join(d, f"run-{name}-{n}-{rep}{'-baseline' if label else ''}")
                    size["settle_s"].append(settle())
                    # Kept until the end: see the README on deleting during the benchmark.
                    run = run_orchestrate(exe, plan, run_dir, n)
                    size["settle_s"].append(settle())
                    loops.append(run_loop(n))
                    before, after = loops[-2], loops[-1]
                    run["loop_stages_per_s"] = 2 * n / (before["wall_s"] + after["wall_s"])
                    run["ratio_to_subprocess_run_loop"] = run["stages_per_s"] / run["loop_stages_per_s"]
                    size["plans"][name + label].append(run)
                print(f"{n}: rep {rep + 1}/{reps}: "
                      + ", ".join(f"{k} {v[-1]['stages_per_s']:.0f}/s (loop {v[-1]['loop_stages_per_s']:.0f}/s, "
                                  f"ratio {v[-1]['ratio_to_subprocess_run_loop']:.3f}) {v[-1]['peak_rss_kib'] / 1024:.1f} MiB"
                                  for k, v in size["plans"].items()), file=sys.stderr)
            loop = spread([r["stages_per_s"] for r in loops])
            summary = {"subprocess_run_loop_stages_per_s": loop,
                       "rss_bound_mib": 10 + n / 1024}
            for name, runs in size["plans"].items():
                rates = [r["stages_per_s"] for r in runs]
                ratios = [r["ratio_to_subprocess_run_loop"] for r in runs]
                summary[name] = {
                    "stages_per_s": spread(rates),
                    "ratio_to_subprocess_run_loop": spread(ratios),
                    "peak_rss_mib": spread([r["peak_rss_kib"] / 1024 for r in runs]),
                    "first_stage_started_s": spread([r["first_stage_started_s"] for r in runs if r["first_stage_started_s"] is not None] or [float("nan")]),
                }
            if args.baseline:
                # New over old, same plan, same run: the median of the per-repetition ratios
                # (each repetition ran both binaries back to back).
                for name in plans:
                    new, old = size["plans"][name], size["plans"][name + bins[1][0]]
                    summary[name]["new_over_baseline"] = spread(
                        [a["stages_per_s"] / b["stages_per_s"] for a, b in zip(new, old)])
            size["summary"] = summary
            result["sizes"][str(n)] = size
            print(json.dumps({n: summary}, indent=1), file=sys.stderr)
        # Written before the run directories are removed (minutes, at 100,000 stages).
        result["load_average_1_5_15_min_at_end"] = os.getloadavg()
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}; removing the run directories", file=sys.stderr)


if __name__ == "__main__":
    main()
