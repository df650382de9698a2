#!/usr/bin/env python3
"""A written-out plan's memory: peak RSS of `orchestrate validate` and of a whole run of a plan
of N stages written out one `[[stage]]` table each, each `after` the one before (every stage
runs `true`), against the bound 10 MiB + 1 KiB per stage.

  bench/overhead/plan_memory.py --bin target/release/orchestrate --sizes 1000,20000,100000 \
      --reps 3 --out bench/overhead/plan-memory-DATE-COMMIT.json [--baseline OLD_BIN]

Peak RSS is the orchestrate process's high-water mark as GNU time (/usr/bin/time) reports it
(see `measure` for why not Python's own wait4). With
--baseline, an older binary runs the same plans right after the new one in every repetition.
Run directories go under --run-base (default: the system's temporary directory) and are
deleted after each run, with a `sync` outside the timing.
"""
import argparse, json, os, platform, shutil, statistics, subprocess, sys, tempfile, time

from chain_plan import write_chain_plan


def write_plan(n, path):
    write_chain_plan(n, path, header='[run]\nname = "written-out"\nmax_parallel = 1\n')


def measure(argv):
    """Wall and peak RSS of one run of `argv`. The peak comes from GNU time, not from this
    process's wait4: a child forked (or vforked) from Python keeps the interpreter's own
    resident pages in its high-water mark across exec (about 15 MiB), which would hide a
    small plan's figure."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        t0 = time.perf_counter()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *argv],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed: {p.stderr.decode(errors='replace')[-2000:]}")
        peak_kib = int(rss.read().split()[-1])
    return {"wall_s": round(wall, 3), "peak_rss_kib": peak_kib}


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--baseline")
    ap.add_argument("--sizes", default="1000,20000,100000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--run-base")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    bins = {"new": os.path.abspath(args.bin)}
    if args.baseline:
        bins["baseline"] = os.path.abspath(args.baseline)
    commit = os.environ.get("BENCH_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "commit": commit,
        "what": "peak RSS (GNU time %M) of orchestrate validate and of a run of N written-out "
                "chained `true` stages; bound 10 MiB + 1 KiB per stage",
        "load_average_1_5_15_min_at_start": os.getloadavg(),
        "bins": {k: subprocess.run([b, "--version"], capture_output=True, text=True).stdout.strip()
                 for k, b in bins.items()},
        "sizes": {},
    }
    base = tempfile.mkdtemp(prefix="plan-memory-", dir=args.run_base)
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            plan = os.path.join(base, f"written-out-{n}.toml")
            write_plan(n, plan)
            bound_kib = 10 * 1024 + n
            runs = {k: {"validate": [], "run": []} for k in bins}
            for rep in range(args.reps):
                for name, binary in bins.items():
                    runs[name]["validate"].append(measure([binary, "validate", plan]))
                    run_dir = os.path.join(base, f"run-{n}-{rep}-{name}")
                    os.sync()
                    runs[name]["run"].append(
                        measure([binary, "--plan", plan, "--run-dir", run_dir, "-q"]))
                    shutil.rmtree(run_dir)
                    print(f"{n} rep {rep} {name}: validate "
                          f"{runs[name]['validate'][-1]['peak_rss_kib']} KiB, run "
                          f"{runs[name]['run'][-1]['peak_rss_kib']} KiB "
                          f"(bound {bound_kib} KiB)", file=sys.stderr)
            entry = {"bound_kib": bound_kib}
            for name, r in runs.items():
                entry[name] = {
                    what: {"peak_rss_kib": summary([x["peak_rss_kib"] for x in xs]),
                           "wall_s": summary([x["wall_s"] for x in xs]),
                           "within_bound": all(x["peak_rss_kib"] <= bound_kib for x in xs)}
                    for what, xs in r.items()
                }
            result["sizes"][str(n)] = entry
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
