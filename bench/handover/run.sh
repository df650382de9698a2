#!/usr/bin/env bash
# The hand-on-at-release benchmark, run on the device machine from the repository root:
#   bench/handover/run.sh BIN_DIR OUT_DIR
# BIN_DIR holds release builds of orchestrate and stage-worker (stage-worker linked against
# the torch 2.11 wheel's libtorch, as for bench/boundary) and COMMIT; this host's PyTorch 2.11
# provides libtorch at run time. OUT_DIR gets machine.txt, disk_probe.json, results.json and
# summary.md.
# About 185 s on an H200, estimated (one warm-up and 14 runs of 4 stages of the 100M model:
# independent on/off, chain early/early-fsync/early-inline/on/off, twice; REPEATS=1: about
# 95 s). results.json is
# written after every run. BENCH_TINY=1 rehearses it on a CPU (a fake GPU and stage-worker's
# simulated CUDA device, so the hand-on and the early start happen).
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${BENCH_TINY:-}" != 1 ]; then
  TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
  export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
W=${BENCH_WORK:-/tmp/handover-bench}; rm -rf "$W"; mkdir -p "$W"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "binaries built from: $(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)"
  echo "gpu: $(nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores"
  echo "work dir: $W on $(df -h "$W" | tail -1 | awk '{print $1" ("$2")"}')"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"
# The page cache's and the disk's speed for one checkpoint-sized file, by each way of writing
# it (about 15 s): what the write-back modes of the benchmark below are compared against.
python3 "$HERE/disk_probe.py" "$W" "$OUT/disk_probe.json"
python3 "$HERE/bench.py" "$BIN" "$OUT" "$W"
rm -rf "$W"
