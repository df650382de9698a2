#!/usr/bin/env bash
# The Llama benchmark, for a lent GPU (issue 50): stage-worker's built-in `train` stage on a
# 1.1B-parameter Llama (TinyLlama's shape: width 2048, 22 layers, 32 query / 4 key-value heads,
# vocabulary 32000; random init, saved by transformers) against torch.compile of transformers'
# LlamaForCausalLM with the same step (bf16 autocast, fp32 masters, AdamW, clipping, schedule)
# from the same weights on the same batches: tokens/s median and range over ROUNDS (3) runs of
# each, interleaved, and both loss curves over STEPS (100) steps.
#
#   BIN_DIR=/path/to/release/bins OUT=/path/to/out bench/llama/gpu.sh
#
# BIN_DIR holds a release build of stage-worker (and COMMIT); this host's python3 provides
# PyTorch 2.11 (its lib/ is the libtorch the binary links against), transformers and
# tokenizers. OUT gets machine.txt, results.json (every run, every loss), summary.md and each
# run's stderr. Knobs: ROUNDS, STEPS, BATCH (32), SEQ (256), SHAPE (1b), PEER_MODE (compile).
# First `stage-worker check-kernels` (CHECK_KERNELS=0 skips it): the worker's kernels against
# libtorch's on this GPU, the Llama step's loss and gradients included, into
# OUT/check-kernels.jsonl (a failure is reported, and the benchmark still runs).
# PROFILE=1 adds one short profiled run of each side first (PROFILE_SKIP (5) steps, then
# PROFILE_STEPS (3) traced): OUT/profiles/*.json.gz and their summary OUT/profiles.md.
# BENCH_TINY=1 rehearses the whole script on a CPU in under a minute.
set -euo pipefail
: "${BIN_DIR:?set BIN_DIR to the directory of the release binaries}"
: "${OUT:?set OUT to the output directory}"
BIN=$(cd "$BIN_DIR" && pwd); mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../machine.sh"
bench_setup
W=${BENCH_WORK:-/tmp/llama-bench}; rm -rf "$W"; mkdir -p "$W"
machine_info "$BIN" | tee "$OUT/machine.txt"
if [ -z "${BENCH_TINY:-}" ] && [ "${CHECK_KERNELS:-1}" = 1 ]; then
  if "$BIN/stage-worker" check-kernels > "$OUT/check-kernels.jsonl" 2> "$OUT/check-kernels.log"; then
    echo "check-kernels: all within tolerance"
  else
    echo "check-kernels: FAILED (see check-kernels.jsonl)"
  fi
  grep -i llama "$OUT/check-kernels.jsonl" || true
fi
python3 "$HERE/bench.py" "$BIN" "$OUT" "$W"
# The worker's losses against the peer's own run-to-run noise (needs two peer runs).
python3 "$HERE/loss_noise.py" "$OUT/results.json" > "$OUT/loss-noise.md" 2>&1 && cat "$OUT/loss-noise.md"
if [ -d "$OUT/profiles" ]; then
  python3 "$HERE/../throughput/profile_summary.py" "${PROFILE_STEPS:-3}" "$OUT"/profiles/*.json \
    > "$OUT/profiles.md"
  cat "$OUT/profiles.md"
  gzip -f "$OUT"/profiles/*.json
fi
rm -rf "$W"
