#!/usr/bin/env bash
# The boundary benchmark, run on the device machine from the repository root:
#   bench/boundary/run.sh BIN_DIR OUT_DIR
# BIN_DIR holds stripped release builds of orchestrate and stage-worker (built elsewhere
# against the torch 2.11 wheel) and COMMIT (the commit they were built from); this host's
# PyTorch 2.11 provides libtorch. OUT_DIR gets machine.txt, results.json and summary.md.
# PARTS (default "cold m100 dd m1b") selects what runs, CHAIN_VARIANTS which variants of a chain
# (orchestrate orchestrate-reps orchestrate-exec python-fresh python-one); BENCH_TINY=1 rehearses
# on a CPU.
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../machine.sh"
bench_setup
W=${BENCH_WORK:-/tmp/boundary-bench}; rm -rf "$W"; mkdir -p "$W"
{
  machine_info "$BIN"
  echo "work dir: $W on $(df -h "$W" | tail -1 | awk '{print $1" ("$2")"}')"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
python3 "$HERE/bench.py" "$BIN" "$OUT" "$W"
python3 "$HERE/summarize.py" "$OUT/results.json" > "$OUT/summary.md"
cat "$OUT/summary.md"
rm -rf "$W"
