#!/usr/bin/env bash
# The throughput benchmark, run on the device machine from the repository root:
#   bench/throughput/run.sh BIN_DIR OUT_DIR
# BIN_DIR holds stripped release builds of orchestrate and stage-worker and COMMIT (the commit
# they were built from); this host's PyTorch 2.11 provides libtorch. OUT_DIR gets machine.txt,
# results.json, summary.md and, with PROFILE=1, profiles/ and profiles.md. Other knobs: see
# bench.py. BENCH_TINY=1 rehearses the whole script on a CPU.
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../machine.sh"
bench_setup
W=${BENCH_WORK:-/tmp/throughput-bench}; rm -rf "$W"; mkdir -p "$W"
{
  machine_info "$BIN"
  echo "worker variants: ${WORKER_VARIANTS:-default}; shapes: ${SHAPES:-m100 m1b}; repeats: ${REPEATS:-3}"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
python3 "$HERE/bench.py" "$BIN" "$OUT" "$W"
python3 "$HERE/summarize.py" "$OUT/results.json" > "$OUT/summary.md"
cat "$OUT/summary.md"
if [ -d "$OUT/profiles" ]; then
  python3 "$HERE/profile_summary.py" 3 "$OUT"/profiles/*.json > "$OUT/profiles.md"
  cat "$OUT/profiles.md"
  gzip -f "$OUT"/profiles/*.json
fi
rm -rf "$W"
