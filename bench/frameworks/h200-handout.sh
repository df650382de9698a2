#!/usr/bin/env bash
# On the GPU machine: how orchestrate hands a stage its GPU, and whose fault memory left on
# it is. Three checks, results under $OUT (each run's report.json and console):
#  1. which GPU a stage's CUDA context lands on, by the names it was given;
#  2. a process outside orchestrate takes 3.6 GiB during a stage: verdict taken_by_other, the
#     next stage waits until it lets go (on_leak = "quarantine" must not fire);
#  3. DeepSpeed's initialize under orchestrate (CUDA_VISIBLE_DEVICES an index), three
#     instances one after another, against the same script given a UUID as before.
# Usage: bench/frameworks/h200-handout.sh BIN_DIR (holding orchestrate); wheels in .whl/.
set -uo pipefail
bin=$(cd "$1" && pwd)
cd "$(dirname "$0")"
out=${OUT:-/tmp/out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls ../../.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site ../../.whl/*.whl && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version,memory.used --format=csv > "$out/gpus.csv"
"$bin/orchestrate" --version > "$out/version.txt" 2>&1
"$bin/orchestrate" gpu-check --json > "$out/gpu-check.json" 2>&1
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
work=$(mktemp -d)
cp which_gpu.py stranger.py ds_min.py "$work/"

# 1. Which GPU.
cat > "$work/which.toml" <<'PLAN'
[[stage]]
name = "which"
gpus = 1
command = ["python3", "which_gpu.py"]
outputs = ["which_gpu.json"]
PLAN
"$bin/orchestrate" --plan "$work/which.toml" --run-dir "$work/run-which" > "$out/which.console" 2>&1
echo "which: exit $?" >> "$out/summary.txt"
cp "$work/run-which/report.json" "$out/which.report.json"
cp "$work/run-which/stages/which/output/which_gpu.json" "$out/which_gpu.json"

# 2. A foreign holder during a stage.
cp taken.toml "$work/taken.toml"
"$bin/orchestrate" --plan "$work/taken.toml" --run-dir "$work/run-taken" > "$out/taken.console" 2>&1 &
orch=$!
for _ in $(seq 600); do [ -f "$work/run-taken/stages/first/output/which_gpu.json" ] && break; sleep 0.1; done
python3 "$work/stranger.py" "$uuid" 3600 20 "$out/stranger.json" &
wait $orch
echo "taken: exit $?" >> "$out/summary.txt"
wait
cp "$work/run-taken/report.json" "$out/taken.report.json"
cp "$work/run-taken/stages/second/output/start.txt" "$out/taken.second-start.txt"

# 3. DeepSpeed: first as before (a UUID in CUDA_VISIBLE_DEVICES), then under orchestrate.
(cd "$work" && CUDA_VISIBLE_DEVICES="$uuid" timeout 300 python3 ds_min.py) > "$out/ds-uuid.console" 2>&1
echo "deepspeed with a UUID: exit $?" >> "$out/summary.txt"
cat > "$work/ds.toml" <<'PLAN'
[run]
max_parallel = 1
[[stage]]
name = "ds"
gpus = 1
command = ["python3", "ds_min.py"]
outputs = ["ds.json"]
matrix = { i = [1, 2, 3] }
PLAN
"$bin/orchestrate" --plan "$work/ds.toml" --run-dir "$work/run-ds" > "$out/ds.console" 2>&1
echo "deepspeed under orchestrate: exit $?" >> "$out/summary.txt"
cp "$work/run-ds/report.json" "$out/ds.report.json"
for f in "$work"/run-ds/stages/*/output/ds.json; do
  echo "$(basename "$(dirname "$(dirname "$f")")") $(cat "$f")" >> "$out/ds-instances.txt"
done
cat "$out/summary.txt"
