#!/usr/bin/env bash
# The GPU benchmark, run on the device machine from the repository root:
#   bench/gpu/run.sh BIN_DIR OUT_DIR
# BIN_DIR holds release builds of orchestrate and stage-worker (built elsewhere, against the
# torch 2.11 wheel); this host's PyTorch 2.11 provides libtorch. Everything lands in OUT_DIR:
# results.tar.gz (reports, journals, timelines, pictures, logs) and summary.md/json.
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$BIN:$PATH"
W=/tmp/gpu-bench; rm -rf "$W"; mkdir -p "$W"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$W/bench.log"; }

{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader; python3 -c 'import torch;print("torch", torch.__version__)'; } > "$W/machine.txt" 2>&1
cat "$W/machine.txt"

log "quickstart"
orchestrate --plan configs/quickstart.toml --run-dir "$W/quickstart" -q; echo "exit $?" > "$W/quickstart.exit"

log "headline: 5 stages in one Python process with a stray reference"
python3 "$HERE/one_process_stages.py" --stray-reference --d-model 1024 --layers 8 --heads 16 --batch 32 --seq 256 --steps 50 > "$W/one_process.json" 2> "$W/one_process.err"
log "headline: the same 5 stages under orchestrate"
orchestrate --plan "$HERE/plans/five-stages.toml" --run-dir "$W/five" -q; echo "exit $?" > "$W/five.exit"

python3 "$HERE/make_plans.py" "$W/plans"
log "reclaim after 1, 8, 64 GiB"
orchestrate --plan "$W/plans/reclaim.toml" --run-dir "$W/reclaim" -q; echo "exit $?" > "$W/reclaim.exit"
log "handoff over 20 stages"
orchestrate --plan "$W/plans/handoff.toml" --run-dir "$W/handoff" -q; echo "exit $?" > "$W/handoff.exit"

log "leak fixture: GPU-holding grandchild"
orchestrate --plan "$HERE/plans/leak-grandchild.toml" --run-dir "$W/leak-grandchild" -q; echo "exit $?" > "$W/leak-grandchild.exit"
log "leak fixture: outside process"
export LEAK_SIGNAL="$W/leak-signal"; rm -f "$LEAK_SIGNAL"
orchestrate --plan "$HERE/plans/leak-outside.toml" --run-dir "$W/leak-outside" -q & ORCH=$!
for _ in $(seq 400); do [ -f "$LEAK_SIGNAL" ] && break; sleep 0.05; done
stage-worker hold --gib 4 --seconds 20 > "$W/outside-holder.log" 2>&1 & HOLDER=$!
echo "$HOLDER" > "$W/outside-holder.pid"
wait $ORCH; echo "exit $?" > "$W/leak-outside.exit"
kill $HOLDER 2>/dev/null; wait $HOLDER 2>/dev/null

log "summary"
python3 "$HERE/summarize.py" "$W" > "$OUT/summary.md"
cp "$W/summary.json" "$OUT/" 2>/dev/null
cp "$W/quickstart/gpu-memory.svg" "$OUT/quickstart-gpu-memory.svg" 2>/dev/null
cp "$W/five/gpu-memory.svg" "$OUT/five-stages-gpu-memory.svg" 2>/dev/null
tar -C "$W" --exclude='*.safetensors' -czf "$OUT/results.tar.gz" . 2>/dev/null
cat "$OUT/summary.md"
