#!/usr/bin/env bash
# A/B of two builds on a lent GPU, in one call, so the machine is the same for both: training
# throughput (bench/throughput, both workers under the newer orchestrate, interleaved, beside
# `torch.compile`) and the stage boundary (bench/boundary's 100M chain, each build's own pair of
# binaries, alternating BEFORE, AFTER, BEFORE, AFTER).
#
#   bench/ab/gpu.sh BEFORE_DIR AFTER_DIR OUT_DIR
#
# Each *_DIR holds stripped release builds of `orchestrate` and `stage-worker` and `COMMIT`.
# Knobs: SHAPES (throughput shapes, default "m100 m1b"), REPEATS (throughput rounds, 3),
# BOUNDARY_ROUNDS (alternations of the boundary chain, 2), PARTS_AB ("throughput boundary").
set -uo pipefail
BEFORE=$(cd "$1" && pwd); AFTER=$(cd "$2" && pwd); OUT=$(mkdir -p "$3" && cd "$3" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
for part in ${PARTS_AB:-throughput boundary}; do
  case $part in
    throughput)
      WORKER_VARIANTS="default WORKER=$BEFORE/stage-worker" PEERS=${PEERS:-compile} \
        SHAPES=${SHAPES:-m100 m1b} REPEATS=${REPEATS:-3} \
        "$HERE/../throughput/run.sh" "$AFTER" "$OUT/throughput" ;;
    boundary)
      for round in $(seq 1 "${BOUNDARY_ROUNDS:-2}"); do
        for arm in before after; do
          dir=$BEFORE; [ "$arm" = after ] && dir=$AFTER
          PARTS=m100 ORCH_REPS=1 CHAIN_VARIANTS=orchestrate \
            "$HERE/../boundary/run.sh" "$dir" "$OUT/boundary-$arm-$round"
        done
      done ;;
  esac
done
echo "before: $(cat "$BEFORE/COMMIT")  after: $(cat "$AFTER/COMMIT")" > "$OUT/arms.txt"
