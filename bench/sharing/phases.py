"""Where a tiny GPU stage's wall goes: for each run directory given, the median (and range) over
its stages of each phase, from the report's timings and the `phases.json` that `tiny.py` writes:

  spawn -> first line       fork from the zygote (or exec) up to the script's first line
  first line -> imported    its imports (torch: none where the zygote preloaded it)
  imported -> CUDA ready    torch.cuda.init() (with the allocator cap, where declared)
  CUDA ready -> allocated   the first CUDA allocation (the context is made here)
  allocated -> summed       a kernel and the copy back
  summed -> last line       the script's own work after that (the file; the barrier, if any)
  last line -> exited       interpreter exit, CUDA context teardown, until the exit is reaped
  exited -> tree gone       no process of the stage left
  tree gone -> verified     the GPU verdict (memory back to its baseline)
  verified -> next spawn    the run between one stage's verdict and the next one's start
                            (only meaningful for stages run one after another)

Usage: python3 phases.py RUN_DIR [RUN_DIR ...]"""
import json
import os
import statistics
import sys

PHASES = [
    ("spawn -> first line", "spawned", "first_line"),
    ("first line -> imported", "first_line", "imported"),
    ("imported -> CUDA ready", "imported", "cuda_ready"),
    ("CUDA ready -> allocated", "cuda_ready", "allocated"),
    ("allocated -> summed", "allocated", "summed"),
    ("summed -> last line", "summed", "last_line"),
    ("last line -> exited", "last_line", "exited"),
    ("exited -> tree gone", "exited", "tree_gone"),
    ("tree gone -> verified", "tree_gone", "verified"),
]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def stage_moments(stage):
    t = stage.get("timing") or {}
    moments = {k: t[k] for k in ("spawned", "exited", "tree_gone", "verified") if t.get(k)}
    path = os.path.join(stage.get("output_dir", ""), "phases.json")
    if os.path.exists(path):
        with open(path) as f:
            moments.update(json.load(f))
    return moments


def summarize(run_dir):
    with open(os.path.join(run_dir, "report.json")) as f:
        report = json.load(f)
    stages = [stage_moments(s) for s in report["stages"]]
    print(f"{run_dir}: {len(stages)} stages, wall {report['wall_s']:.2f} s, "
          f"{len(stages) / report['wall_s']:.2f} stages/s")
    rows = []
    for label, a, b in PHASES:
        xs = [m[b] - m[a] for m in stages if a in m and b in m]
        rows.append((label, xs))
    walls = [m["verified"] - m["spawned"] for m in stages if "verified" in m and "spawned" in m]
    rows.append(("spawn -> verified (a stage's wall)", walls))
    ordered = sorted((m for m in stages if "spawned" in m and "verified" in m), key=lambda m: m["spawned"])
    gaps = [b["spawned"] - a["verified"] for a, b in zip(ordered, ordered[1:])]
    rows.append(("verified -> next spawn", gaps))
    for label, xs in rows:
        if xs:
            print(f"  {label:36} median {median(xs) * 1000:8.1f} ms  "
                  f"range {min(xs) * 1000:8.1f}–{max(xs) * 1000:8.1f} ms  n={len(xs)}")
    return rows


if __name__ == "__main__":
    for d in sys.argv[1:]:
        summarize(d)
