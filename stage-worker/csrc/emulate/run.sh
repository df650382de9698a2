#!/usr/bin/env bash
# Runs the fused kernels on the host (emulate.cpp): compiles ../kernels.cu, included directly,
# with a host shim and checks the kernels against reference loops.
#   stage-worker/csrc/emulate/run.sh      (needs a C++20 compiler, $CXX or c++; prints ALL OK
#   or FAILED)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"${CXX:-c++}" -std=c++20 -O1 -pthread -o "$WORK/emulate" "$HERE/emulate.cpp"
"$WORK/emulate"
