#!/usr/bin/env bash
# multi_gpu.sh REPS times, then one summary with median and range per figure:
#   bench/gpu/multi_gpu_reps.sh BIN_DIR OUT_DIR [SAMPLES] [REPS]     defaults 16 and 3
# Each repetition writes OUT_DIR/repN/ (summary.json, pictures, results.tar.gz) as soon as it
# ends, so a run cut short still returns the repetitions it finished; summary.md and
# summary.json in OUT_DIR aggregate whatever repetitions are there.
set -uo pipefail
BIN=$1; OUT=$(mkdir -p "$2" && cd "$2" && pwd); SAMPLES=${3:-16}; REPS=${4:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
for i in $(seq 1 "$REPS"); do
  echo "=== repetition $i of $REPS ($(date -u +%H:%M:%S))"
  bash "$HERE/multi_gpu.sh" "$BIN" "$OUT/rep$i" "$SAMPLES" > "$OUT/rep$i.log" 2>&1
  echo "exit $?"; tail -n 3 "$OUT/rep$i.log"
  python3 "$HERE/summarize_multi_gpu.py" "$OUT" "$SAMPLES"
done
