#!/usr/bin/env bash
# On the GPU machine, after the run loop's redesign (issue 31): the GPU paths through the new
# scheduler and supervision, with a release build of the new tree.
#  1. bench/frameworks/h200-handout.sh as it is: which GPU a stage lands on, a foreign holder
#     during a stage (taken_by_other, the next stage waits), DeepSpeed under orchestrate;
#  2. the same foreign holder under `orchestrate daemon`: the run's events.jsonl must carry the
#     typed gpu_not_reclaimed event (verdict taken_by_other) a watcher receives;
#  3. a plan the GPU cannot hold (gpus = 2 on a one-GPU machine) refused at submit (`refused`).
# Usage: bench/gpu/redesign_check.sh BIN_DIR (holding orchestrate); results under $OUT.
set -uo pipefail
bin=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/out}
mkdir -p "$out/handout" "$out/daemon"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
date -u +%Y-%m-%dT%H:%M:%SZ > "$out/started.txt"
nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv > "$out/gpus.csv"

# 1.
OUT="$out/handout" bash "$here/../frameworks/h200-handout.sh" "$bin" > "$out/handout.console" 2>&1
echo "handout: exit $?" >> "$out/summary.txt"

# 2. and 3. The daemon.
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
work=$(mktemp -d)
cp "$here/../frameworks/which_gpu.py" "$here/../frameworks/stranger.py" "$work/"
sock="$work/d.sock"
"$bin/orchestrate" daemon --socket "$sock" --runs-dir "$work/runs" > "$out/daemon/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
cp "$here/../frameworks/taken.toml" "$work/taken.toml"
(cd "$work" && "$bin/orchestrate" submit taken.toml --socket "$sock" --wait) > "$out/daemon/submit.console" 2>&1 &
submit=$!
for _ in $(seq 600); do
  ls "$work"/runs/*/stages/first/output/which_gpu.json >/dev/null 2>&1 && break
  sleep 0.1
done
python3 "$work/stranger.py" "$uuid" 3600 20 "$out/daemon/stranger.json" &
wait $submit
echo "daemon run: exit $?" >> "$out/summary.txt"
cp "$work"/runs/*/events.jsonl "$out/daemon/events.jsonl"
cp "$work"/runs/*/report.json "$out/daemon/report.json"
grep -c '"event":"gpu_not_reclaimed"' "$out/daemon/events.jsonl" > "$out/daemon/gpu_not_reclaimed.count"
cat > "$work/two.toml" <<'PLAN'
[[stage]]
name = "two"
gpus = 2
command = ["true"]
PLAN
(cd "$work" && "$bin/orchestrate" submit two.toml --socket "$sock" --json) > "$out/daemon/refused.json" 2>&1
echo "submit of gpus = 2: exit $?" >> "$out/summary.txt"
ls "$work/runs" > "$out/daemon/runs-after-refusal.txt"
"$bin/orchestrate" shutdown --socket "$sock" >/dev/null 2>&1
wait $daemon
wait
cat "$out/summary.txt"
