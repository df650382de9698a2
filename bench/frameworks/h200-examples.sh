#!/usr/bin/env bash
# On the GPU machine: the shipped framework examples as GPU plans, each run once, results in
# $OUT/results.tar.gz (every run's report.json, console and stage logs) and a summary on stdout.
#   part a: HF Trainer, Lightning, torchrun (NCCL), seed 000 with Accelerate, and the HF Trainer
#           plan stopped by SIGTERM during training, then resumed;
#   part c: Lightning and seed 001's DeepSpeed fine-tune (the small model) each stopped by SIGTERM
#           during training, then resumed;
#   part b: seed 001 with DeepSpeed ZeRO-2 on a 1.1B Llama, one fresh process per stage, and the
#           seed's loop in one Python process with each of its two cleanups.
# Usage: bench/frameworks/h200-examples.sh BIN_DIR a|b|c   (wheels for DeepSpeed in .whl/)
set -uo pipefail
bin=$(cd "$1" && pwd)
part=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}
res=$(mktemp -d)/results
mkdir -p "$out" "$res"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$repo/python"
if [ "$part" != a ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$repo"/.whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{ date -u; nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version,memory.used --format=csv;
  python3 -c "import torch, transformers, lightning, accelerate; print('torch', torch.__version__, 'transformers', transformers.__version__, 'lightning', lightning.__version__, 'accelerate', accelerate.__version__)"
} > "$res/machine.txt" 2>&1
summary() { echo "$*" | tee -a "$res/summary.txt"; }
keep() { # run dir, name: the report, the console and the stage logs
  mkdir -p "$res/$2"
  cp "$1/report.json" "$res/$2/" 2>/dev/null
  (cd "$1" && find stages -name '*.log' -o -name 'eval.json' -o -name '*result*.json' | tar cf - -T -) | tar xf - -C "$res/$2" 2>/dev/null
  python3 - "$1/report.json" <<'PY' | tee -a "$res/summary.txt"
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no report:", e); sys.exit()
for s in r["stages"]:
    g = ["%s %d->%d->%d MiB %.2f ms" % (x["verdict"], x["baseline_bytes"] >> 20, x["peak_bytes"] >> 20, x["after_bytes"] >> 20, x["reclaim_ms"]) for x in s.get("gpu", [])]
    m = {k: round(v, 4) for k, v in (s.get("metrics") or {}).items()}
    print("  %-22s %-10s try %s exit %s wall %.1fs ckpts %d %s metrics %s" % (s["name"], s["status"], s.get("attempts"), s.get("exit_code"), s.get("wall_s", 0), len(s.get("checkpoints", [])), g, m))
PY
}
run() { # name, plan, extra args
  local name=$1 plan=$2; shift 2
  "$bin/orchestrate" --plan "$plan" --run-dir "$res/../run-$name" "$@" > "$res/$name.console" 2>&1
  summary "$name: exit $?"
  keep "$res/../run-$name" "$name"
}
if [ "$part" = a ]; then
  run hf-trainer "$repo/examples/hf-trainer/plan-gpu.toml"
  run lightning "$repo/examples/lightning/plan-gpu.toml"
  run torchrun "$repo/examples/torchrun/plan-gpu.toml"
  run seed000-accelerate "$repo/configs/seed000-accelerate.toml"
  # A preemption: SIGTERM to orchestrate while the Trainer trains, then a resume.
  dir="$res/../run-hf-stop"
  sed 's|"--steps", "120"\]|"--steps", "6000", "--save-steps", "100000"]|' \
    "$repo/examples/hf-trainer/plan-gpu.toml" > "$repo/examples/hf-trainer/plan-gpu-stop.toml"
  "$bin/orchestrate" --plan "$repo/examples/hf-trainer/plan-gpu-stop.toml" --run-dir "$dir" > "$res/hf-stop.console" 2>&1 &
  pid=$!
  for _ in $(seq 600); do grep -q '"stage_started"' "$dir/journal.jsonl" 2>/dev/null && break; sleep 0.1; done
  sleep 25
  kill -TERM $pid; wait $pid; summary "hf-stop: exit $? after SIGTERM"
  keep "$dir" hf-stop
  "$bin/orchestrate" resume "$dir" > "$res/hf-resume.console" 2>&1
  summary "hf-resume: exit $?"
  keep "$dir" hf-resume
fi
if [ "$part" = b ]; then
  sed 's|"--steps", "100"\]|"--steps", "100", "--size", "1.1b"]|' "$repo/examples/deepspeed-seed001/plan.toml" \
    > "$repo/examples/deepspeed-seed001/plan-1.1b.toml"
  run deepspeed-seed001 "$repo/examples/deepspeed-seed001/plan-1.1b.toml"
  cd "$repo/examples/deepspeed-seed001"
  for cleanup in seed answer; do
    timeout 200 python3 one_process.py --samples ../../configs/data/samples/*.jsonl --size 1.1b \
      --cleanup $cleanup --out "$res/one_process-$cleanup.json" > "$res/one_process-$cleanup.log" 2>&1
    summary "one_process --cleanup $cleanup: exit $?"
    python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1])))[:1500])" "$res/one_process-$cleanup.json" | tee -a "$res/summary.txt"
  done
fi
stop_and_resume() { # name, plan, seconds after the stage started: SIGTERM, then resume
  local name=$1 plan=$2 after=$3 dir="$res/../run-$1"
  "$bin/orchestrate" --plan "$plan" --run-dir "$dir" > "$res/$name-stop.console" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do grep -q '"stage_started"' "$dir/journal.jsonl" 2>/dev/null && break; sleep 0.1; done
  sleep "$after"
  kill -TERM $pid; wait $pid; summary "$name-stop: exit $? after SIGTERM"
  keep "$dir" "$name-stop"
  "$bin/orchestrate" resume "$dir" > "$res/$name-resume.console" 2>&1
  summary "$name-resume: exit $?"
  keep "$dir" "$name-resume"
}
if [ "$part" = c ]; then
  sed 's|"--steps", "150"\]|"--steps", "5000"]|' "$repo/examples/lightning/plan-gpu.toml" \
    > "$repo/examples/lightning/plan-gpu-stop.toml"
  stop_and_resume lightning "$repo/examples/lightning/plan-gpu-stop.toml" 30
  cat > "$repo/examples/deepspeed-seed001/plan-stop.toml" <<'PLAN'
[[stage]]
name = "finetune"
gpus = 1
command = ["python3", "finetune.py", "--sample", "../../configs/data/samples/sample-0.jsonl", "--steps", "1000"]
outputs = ["model.safetensors", "config.json"]
PLAN
  stop_and_resume deepspeed "$repo/examples/deepspeed-seed001/plan-stop.toml" 35
fi
tar czf "$out/results-$part.tar.gz" -C "$(dirname "$res")" results
