#!/usr/bin/env bash
# Runs the fused kernels on the host (emulate.cpp): extracts the CUDA source from
# ../fused.cpp, compiles it with a host shim and checks the kernels against reference loops.
#   stage-worker/csrc/emulate/run.sh      (needs a C++20 compiler, $CXX or c++, and python3;
#   prints ALL OK or FAILED)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 - "$HERE/../fused.cpp" "$WORK/kernels.inc" <<'PY'
import sys
src = open(sys.argv[1]).read()
start = src.index('R"CUDA(') + len('R"CUDA(')
end = src.index(')CUDA"')
open(sys.argv[2], "w").write(src[start:end].replace('extern "C" __global__', "static"))
PY
"${CXX:-c++}" -std=c++20 -O1 -pthread -I "$WORK" -o "$WORK/emulate" "$HERE/emulate.cpp"
"$WORK/emulate"
