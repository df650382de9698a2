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
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
W=${BENCH_WORK:-/tmp/boundary-bench}; rm -rf "$W"; mkdir -p "$W"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "binaries built from: $(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)"
  echo "gpu: $(nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
  echo "torch: $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null)"
  echo "work dir: $W on $(df -h "$W" | tail -1 | awk '{print $1" ("$2")"}')"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
python3 "$HERE/bench.py" "$BIN" "$OUT" "$W"
python3 "$HERE/summarize.py" "$OUT/results.json" > "$OUT/summary.md"
cat "$OUT/summary.md"
rm -rf "$W"
