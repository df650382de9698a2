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
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONUNBUFFERED=1
W=${BENCH_WORK:-/tmp/throughput-bench}; rm -rf "$W"; mkdir -p "$W"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "binaries built from: $(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)"
  echo "gpu: $(nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
  echo "torch: $(python3 -c 'import torch;print(torch.__version__)' 2>/dev/null)"
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
