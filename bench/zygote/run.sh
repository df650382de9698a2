#!/usr/bin/env bash
# On the GPU machine: Python stages through the zygote (`preload`) against a fresh interpreter.
#   1. first line: a stage that imports torch + transformers (Llama) + deepspeed, time from
#      spawn (report.json timing.spawned) to its first line of user code; FIRST_N (6) chained stages
#      through the zygote (the first waits for the zygote's own imports: reported apart) and
#      3 exec'd (ORCHESTRATE_ZYGOTE=0);
#   2. seed 001's DeepSpeed sweep (examples/deepspeed-seed001, small model, 3 samples; its
#      preload names the Llama module, or with SEED_LIST=user it is the list a user writes):
#      per-instance wall through the zygote and exec'd; while the zygote run runs, NVML's
#      compute processes are sampled every 0.5 s to show the zygote never holds a context.
#   3. learning (LEARN_ONLY=1 runs it alone; the others leave it out unless LEARN=1): N=6 chained
#      stages running first_line.py (torch, `from transformers import LlamaConfig,
#      LlamaForCausalLM`, deepspeed when importable), spawn to first line per stage, with
#      `preload = ["torch", "transformers", "deepspeed"]` (deepspeed only when importable) and
#      with `preload = "auto"`, each from an empty cache of what zygotes learn; "auto" again
#      with what the first "auto" run kept; and the same chain exec'd (ORCHESTRATE_ZYGOTE=0).
#      GPUS=0 gives the stages no GPU (the CPU rehearsal).
#      SWEEPS names which of the four learning sweeps run (default all: "list auto auto-again exec").
# Usage: [FIRST_LINE_ONLY=1 | SEED_ONLY=1 | LEARN_ONLY=1] bench/zygote/run.sh BIN_DIR [REPO]   (REPO: the checkout with examples/, configs/,
# python/ and DeepSpeed's wheels in .whl/, default this script's; results in $OUT/results.tar.gz)
set -uo pipefail
bin=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${2:-$here/../..}" && pwd)
out=${OUT:-/tmp/out}
res=$(mktemp -d)/zygote
mkdir -p "$out" "$res"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls "$repo"/.whl/*.whl > /dev/null 2>&1; then
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$repo"/.whl/*.whl
fi
export PYTHONPATH="$repo/python:/tmp/site"
export LD_LIBRARY_PATH="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))'):${LD_LIBRARY_PATH:-}"
{ date -u; cat "$bin/COMMIT" 2>/dev/null;
  nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used --format=csv
  python3 -c "import sys, torch, transformers, deepspeed; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)" 2>/dev/null
} > "$res/machine.txt" 2>&1
preload='preload = ["torch", "transformers", "transformers.models.llama.modeling_llama", "deepspeed"]'
# SEED_LIST=user: seed 001's sweep with the list a user writes, which names no model module.
seed_preload=$preload
[ "${SEED_LIST:-}" = user ] && seed_preload='preload = ["torch", "transformers", "deepspeed"]'

if [ "${LEARN_ONLY:-0}" = 1 ]; then FIRST_LINE_ONLY=skip SEED_ONLY=1 LEARN=1; fi

# 1. First line (SEED_ONLY=1 leaves it out).
chain() { # N: N chained one-GPU stages running first_line.py
  echo "[run]"; echo "$preload"; local prev=
  for i in $(seq "$1"); do
    echo "[[stage]]"; echo "name = \"s$i\""; echo "gpus = 1"
    [ -n "$prev" ] && echo "after = [\"$prev\"]"
    echo "command = [\"python3\", \"$here/first_line.py\"]"; prev=s$i
  done
}
if [ "${SEED_ONLY:-0}" != 1 ]; then
chain "${FIRST_N:-6}" > "$res/first-line-zygote.toml"
chain 3 > "$res/first-line-exec.toml"
# Each zygote part learns from an empty cache of its own, kept with the results: its log
# (cache-*/*.log) has every zygote's and standby's lines ("standby ready", "standby refused:
# …", "a CUDA context was made ahead …"); the console has why a standby was not adopted.
standby_log=orchestrator::process::fork_server::standby=debug,orchestrator::process::zygote=info
ORCHESTRATE_ZYGOTE_CACHE=$res/cache-first RUST_LOG=$standby_log \
  timeout 150 "$bin/orchestrate" --plan "$res/first-line-zygote.toml" --run-dir "$res/run-first-zygote" > "$res/first-zygote.console" 2>&1
echo "first-line zygote: exit $?" >> "$res/summary.txt"
ORCHESTRATE_ZYGOTE=0 timeout 120 "$bin/orchestrate" --plan "$res/first-line-exec.toml" --run-dir "$res/run-first-exec" > "$res/first-exec.console" 2>&1
echo "first-line exec: exit $?" >> "$res/summary.txt"
fi

# 2. Seed 001's DeepSpeed sweep, 3 samples (FIRST_LINE_ONLY=1 leaves it out).
if [ "${FIRST_LINE_ONLY:-0}" = 0 ]; then
mkdir -p "$res/samples"
cp "$repo"/configs/data/samples/sample-{0,1,2}.jsonl "$res/samples/"
seed="$repo/examples/deepspeed-seed001"
sed -e "s|^name = \"deepspeed-seed001\"|name = \"deepspeed-seed001\"\n$seed_preload|" \
    -e "s|\.\./\.\./configs/data/samples/\*\.jsonl|$res/samples/*.jsonl|" \
    "$seed/plan.toml" > "$seed/plan-zygote.toml"
( while sleep 0.5; do date +%s.%N; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; \
    pgrep -f "orchestrate's zygote" | sed 's/^/zygote /'; done ) > "$res/nvml-during-zygote-sweep.txt" 2>&1 &
sampler=$!
ORCHESTRATE_ZYGOTE_CACHE=$res/cache-seed RUST_LOG=orchestrator::process::fork_server::standby=debug,orchestrator::process::zygote=info \
  timeout 170 "$bin/orchestrate" --plan "$seed/plan-zygote.toml" --run-dir "$res/run-seed-zygote" > "$res/seed-zygote.console" 2>&1
echo "seed001 zygote: exit $?" >> "$res/summary.txt"
kill $sampler
ORCHESTRATE_ZYGOTE=0 timeout 200 "$bin/orchestrate" --plan "$seed/plan-zygote.toml" --run-dir "$res/run-seed-exec" > "$res/seed-exec.console" 2>&1
echo "seed001 exec: exit $?" >> "$res/summary.txt"
fi

# 3. Learning: the list a user writes, and "auto" (LEARN=1 or LEARN_ONLY=1).
if [ "${LEARN:-0}" = 1 ]; then
n=${N:-6}
if python3 -c "import deepspeed" > /dev/null 2>&1; then
  listed='["torch", "transformers", "deepspeed"]'
else
  listed='["torch", "transformers"]'; echo "deepspeed is not importable: left out of the list and of the stages" >> "$res/summary.txt"
fi
learn_chain() { # PRELOAD: N chained stages running first_line.py
  echo "[run]"; echo "preload = $1"; local prev=
  for i in $(seq "$n"); do
    echo "[[stage]]"; echo "name = \"s$i\""; [ "${GPUS:-1}" != 0 ] && echo "gpus = ${GPUS:-1}"
    [ -n "$prev" ] && echo "after = [\"$prev\"]"
    echo "command = [\"python3\", \"$here/first_line.py\"]"; prev=s$i
  done
}
learn_chain "$listed" > "$res/learn-list.toml"
learn_chain '"auto"' > "$res/learn-auto.toml"
for sweep in ${SWEEPS:-list auto auto-again exec}; do
  plan=$res/learn-${sweep%-again}.toml; cache=$res/cache-${sweep%-again}; zygote=1
  [ "$sweep" = exec ] && { plan=$res/learn-list.toml; zygote=0; }
  ORCHESTRATE_ZYGOTE=$zygote ORCHESTRATE_ZYGOTE_CACHE=$cache RUST_LOG=orchestrator::process::zygote=info \
    timeout "${SWEEP_TIMEOUT:-150}" "$bin/orchestrate" --plan "$plan" --run-dir "$res/run-learn-$sweep" > "$res/learn-$sweep.console" 2>&1
  echo "learn $sweep: exit $?" >> "$res/summary.txt"
done
mkdir -p "$res/keep" && cp -r "$res"/cache-* "$res/keep/" 2>/dev/null
fi

python3 "$here/summarize.py" "$res" >> "$res/summary.txt" 2>&1
cat "$res/machine.txt" "$res/summary.txt"
for d in "$res"/run-*; do
  mkdir -p "$res/keep/$(basename "$d")"
  cp "$d/report.json" "$res/keep/$(basename "$d")/" 2>/dev/null
  (cd "$d" && find stages -name '*.log' | tar cf - -T -) | tar xf - -C "$res/keep/$(basename "$d")" 2>/dev/null
done
(cd "$res" && tar czf "$out/results.tar.gz" $(ls -d machine.txt summary.txt nvml-during-zygote-sweep.txt \
  keep first-zygote.console first-exec.console seed-zygote.console seed-exec.console learn-*.console learn-*.toml 2>/dev/null))
