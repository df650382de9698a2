#!/usr/bin/env bash
# On the GPU machine: which call leaves the native thread that `import deepspeed` starts
# (nvml_probe.py, each probe in a fresh interpreter), with DeepSpeed installed from the
# carried wheels in .whl/. Usage: OUT=/path bench/zygote/nvml.sh   (writes $OUT/nvml-probe.txt)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$repo"/.whl/*.whl
{ date -u; nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv
  PYTHONPATH=/tmp/site python3 "$here/nvml_probe.py"; } > "$out/nvml-probe.txt" 2>&1
cat "$out/nvml-probe.txt"
