#!/usr/bin/env python3
"""Second by second: stages finished and cross-CPU interrupts, during `orchestrate` and the loop.

The 100,000-stage repetitions of bench.py differ by up to 15% from one another while the
`subprocess.run` loop does not. This harness looks at what differs inside a run: every second
it reads the machine's inter-processor interrupts from /proc/interrupts (function-call IPIs,
`CAL`, which also carry the scheduler's remote wake-ups, and rescheduling IPIs, `RES`) and
counts the stages that finished in that second (from the journal's timestamps for
`orchestrate`, from a counter for the loop). Plan: N independent `true` stages, one at a
time, run directories on RUN_BASE (kept until the end, as in bench.py), alternating with the
loop.

  bench/overhead/regimes.py --bin target/release/orchestrate --stages 20000 --runs 4 \
      --out bench/overhead/regimes-DATE-COMMIT.json
"""
import argparse, bisect, json, os, platform, shutil, statistics, subprocess, sys, tempfile, threading, time

from bench import write_plans

IPI_LINES = ("CAL", "RES")


def ipis():
    """Sum over CPUs of the function-call and rescheduling IPIs so far."""
    total = 0
    with open("/proc/interrupts") as f:
        ncpu = len(f.readline().split())
        for line in f:
            parts = line.split()
            if parts and parts[0].rstrip(":") in IPI_LINES:
                total += sum(int(x) for x in parts[1:1 + ncpu])
    return total


class Sampler:
    """Every second: (wall-clock time, IPIs so far, the loop's count so far)."""

    def __init__(self, count=lambda: 0):
        self.count, self.rows, self.done = count, [], threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        while True:
            self.rows.append((time.time(), ipis(), self.count()))
            if self.done.wait(1.0):
                self.rows.append((time.time(), ipis(), self.count()))
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def windows(rows, finished_at):
    """Per whole second between two samples: stages finished, IPIs, IPIs per stage."""
    out = []
    for (t0, i0, c0), (t1, i1, c1) in zip(rows, rows[1:]):
        if t1 - t0 < 0.9:
            continue
        n = finished_at(t0, t1) if finished_at else c1 - c0
        dt = t1 - t0
        out.append({"stages_per_s": n / dt, "ipis_per_s": (i1 - i0) / dt,
                    "ipis_per_stage": (i1 - i0) / n if n else None})
    # The first and last windows hold the start-up and the end: left out of the summary.
    return out[1:-1] if len(out) > 2 else out


def journal_finishes(run_dir):
    times = []
    with open(os.path.join(run_dir, "journal.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("rec") == "stage_finished":
                times.append(r["t"] / 1000.0)
    times.sort()
    return lambda a, b: bisect.bisect_left(times, b) - bisect.bisect_left(times, a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/orchestrate")
    ap.add_argument("--stages", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--run-base", default=None)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    n = args.stages
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    base = tempfile.mkdtemp(prefix="regimes-", dir=args.run_base)
    # bench.py's plan of N independent stages, one at a time.
    plan = write_plans(n, base)["independent"]
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
              "commit": commit, "stages": n,
              "run_base_fs": subprocess.run(["stat", "-f", "-c", "%T", base], capture_output=True, text=True).stdout.strip(),
              "what": "per second: stages finished and function-call + rescheduling IPIs (all CPUs); "
                      "no-op stages one at a time; first and last second of each run left out",
              "loop": [], "orchestrate": []}
    try:
        for r in range(args.runs):
            os.sync()
            done = [0]
            with Sampler(lambda: done[0]) as s:
                t0 = time.perf_counter()
                for _ in range(n):
                    subprocess.run(["true"], check=True)
                    done[0] += 1
                wall = time.perf_counter() - t0
            result["loop"].append({"stages_per_s": n / wall, "seconds": windows(s.rows, None)})
            os.sync()
            run_dir = os.path.join(base, f"run-{r}")
            with Sampler() as s:
                t0 = time.perf_counter()
                subprocess.run([os.path.abspath(args.bin), "--plan", plan, "--run-dir", run_dir, "-q"],
                               check=True, stdout=subprocess.DEVNULL)
                wall = time.perf_counter() - t0
            result["orchestrate"].append({"stages_per_s": n / wall,
                                          "seconds": windows(s.rows, journal_finishes(run_dir))})
            print(f"run {r + 1}/{args.runs}: loop {result['loop'][-1]['stages_per_s']:.0f}/s, "
                  f"orchestrate {result['orchestrate'][-1]['stages_per_s']:.0f}/s", file=sys.stderr)
        summary = {}
        for who in ("loop", "orchestrate"):
            secs = [w for run in result[who] for w in run["seconds"] if w["ipis_per_stage"] is not None]
            few = [w["stages_per_s"] for w in secs if w["ipis_per_stage"] < 1.0]
            many = [w["stages_per_s"] for w in secs if w["ipis_per_stage"] >= 1.0]
            summary[who] = {
                "seconds": len(secs),
                "ipis_per_stage_median": statistics.median(w["ipis_per_stage"] for w in secs) if secs else None,
                "seconds_under_1_ipi_per_stage": len(few),
                "stages_per_s_under_1_ipi_per_stage": statistics.median(few) if few else None,
                "seconds_at_1_or_more_ipis_per_stage": len(many),
                "stages_per_s_at_1_or_more_ipis_per_stage": statistics.median(many) if many else None,
            }
        result["summary"] = summary
        print(json.dumps(summary, indent=1), file=sys.stderr)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}; removing the run directories", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
