#!/usr/bin/env bash
# A forked Python stage's exit on the CPU, two orchestrate binaries alternating: N chained
# stages (bench/zygote/tiny_cpu.py: torch and transformers' Llama classes, preloaded by the
# zygote) per run, REPS runs of each binary; bench/sharing/phases.py prints each run's phases
# ("last line -> exited" is the exit), and a last line the median over all forked stages.
#   PYTHON=/path/to/python bench/zygote/cpu_exit.sh OLD_BIN NEW_BIN [N (12)] [REPS (3)]
set -euo pipefail
old=$1 new=$2 n=${3:-12} reps=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
python=${PYTHON:-python3}
work=${WORK:-/tmp/zygote-cpu-exit}
rm -rf "$work"; mkdir -p "$work"
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
export ORCHESTRATE_ZYGOTE_CACHE="$work/cache"
{
  echo '[run]'; echo 'name = "tiny-cpu"'
  echo 'preload = ["torch", "transformers", "transformers.models.llama.modeling_llama"]'
  for i in $(seq "$n"); do
    echo "[[stage]]"; echo "name = \"t$i\""
    [ "$i" -gt 1 ] && echo "after = [\"t$((i - 1))\"]"
    echo "command = [\"$python\", \"$here/tiny_cpu.py\"]"; echo 'outputs = ["sum.txt"]'
  done
} > "$work/plan.toml"
for r in $(seq "$reps"); do
  for which in old new; do
    bin=$old; [ "$which" = new ] && bin=$new
    "$bin" --plan "$work/plan.toml" --run-dir "$work/run-$which-$r" -q > "$work/$which-$r.console" 2>&1 \
      || { echo "$which rep $r failed:"; tail -5 "$work/$which-$r.console"; }
  done
done
for which in old new; do
  "$python" "$here/../sharing/phases.py" "$work"/run-"$which"-*
done
"$python" - "$work" <<'PY'
import json, os, statistics, sys
work = sys.argv[1]
for which in ("old", "new"):
    exits, walls = [], []
    for d in sorted(os.listdir(work)):
        if not d.startswith(f"run-{which}-"):
            continue
        report = json.load(open(os.path.join(work, d, "report.json")))
        for s in report["stages"]:
            if (s.get("start") or {}).get("via") != "zygote":
                continue
            t = s["timing"]
            p = json.load(open(os.path.join(s["output_dir"], "phases.json")))
            exits.append(t["exited"] - p["last_line"])
            walls.append(t["verified"] - t["spawned"])
    ms = lambda xs: f"median {statistics.median(xs) * 1000:.0f} ms, range {min(xs) * 1000:.0f}-{max(xs) * 1000:.0f} ms"
    print(f"{which}: {len(exits)} forked stages; last line -> exited {ms(exits)}; spawn -> verified {ms(walls)}")
PY
