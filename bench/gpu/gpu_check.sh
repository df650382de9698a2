#!/usr/bin/env bash
# `orchestrate gpu-check` on a GPU machine: a snapshot, a check that fails while another
# process holds memory (naming it), and a --wait that succeeds once that process exits.
#   bench/gpu/gpu_check.sh BIN_DIR OUT_DIR
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PATH="$BIN:$PATH"
{
  echo "## snapshot"; orchestrate gpu-check; echo "exit $?"
  echo "## json"; orchestrate gpu-check --json; echo "exit $?"
  stage-worker hold --gib 6 --seconds 4 --ready-file /tmp/held & H=$!
  while [ ! -f /tmp/held ]; do sleep 0.05; done
  echo "## while pid $H holds 6 GiB: --wait 1s"; orchestrate gpu-check --wait 1s; echo "exit $?"
  echo "## --wait 30s (the holder exits after 4 s)"; orchestrate gpu-check --wait 30s --json; echo "exit $?"
  wait $H
} 2>&1 | tee "$OUT/gpu-check.txt"
