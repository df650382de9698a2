#!/usr/bin/env bash
# The fused kernels against libtorch's on this machine's GPU, run on the device
# machine from the repository root:
#   bench/throughput/check_kernels.sh BIN_DIR OUT_DIR
# Writes OUT_DIR/check-kernels.jsonl (`stage-worker check-kernels`: relative differences of
# every output and gradient, one model step both ways, the op's time both ways) and
# OUT_DIR/check-kernels.log (the worker's log: where the kernels came from, how long it took).
# The kernel cache is a fresh directory, so the first load compiles.
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../machine.sh"
bench_setup
machine_info "$BIN" > "$OUT/machine.txt"
export STAGE_WORKER_KERNEL_CACHE=$(mktemp -d)
for round in compiled cached; do
  echo "# $round" >> "$OUT/check-kernels.log"
  "$BIN/stage-worker" check-kernels > "$OUT/check-kernels-$round.jsonl" 2>> "$OUT/check-kernels.log"
  echo "exit status $?" >> "$OUT/check-kernels.log"
done
cat "$OUT"/check-kernels-*.jsonl "$OUT/check-kernels.log"
rm -rf "$STAGE_WORKER_KERNEL_CACHE"
