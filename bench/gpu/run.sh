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

# PARTS selects what runs (default: all): core = quickstart, headline, reclaim, handoff, leaks;
# sweep = seed 001's loop against one Python process; seed000 = the Accelerate pipeline.
PARTS=${PARTS:-core sweep seed000}
want() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
python3 "$HERE/make_plans.py" "$W/plans"

if want core; then
log "quickstart"
orchestrate --plan configs/quickstart.toml --run-dir "$W/quickstart" -q; echo "exit $?" > "$W/quickstart.exit"

log "headline: 5 stages in one Python process with a stray reference"
python3 "$HERE/one_process_stages.py" --stray-reference --d-model 1024 --layers 8 --heads 16 --batch 32 --seq 256 --steps 50 > "$W/one_process.json" 2> "$W/one_process.err"
log "headline: the same 5 stages under orchestrate"
orchestrate --plan "$HERE/plans/five-stages.toml" --run-dir "$W/five" -q; echo "exit $?" > "$W/five.exit"

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
fi

if want sweep; then
log "seed 001's loop: 20 fine-tune + eval instances under orchestrate"
orchestrate --plan "$W/plans/sweep20.toml" --run-dir "$W/sweep20" -q; echo "exit $?" > "$W/sweep20.exit"
log "seed 001's loop: the same 20 in one Python process keeping its references"
python3 "$HERE/one_process_stages.py" --stray-reference --stages 20 --d-model 512 --layers 4 --heads 8 --batch 32 --seq 128 --steps 50 --eval-batches 4 > "$W/one_process20.json" 2> "$W/one_process20.err"
fi

if want seed000; then
log "seed 000: pretrain → SFT with Accelerate, as two stages"
orchestrate --plan configs/seed000-accelerate.toml --run-dir "$W/seed000" -q; echo "exit $?" > "$W/seed000.exit"
fi

log "summary"
python3 "$HERE/summarize.py" "$W" > "$OUT/summary.md"
cp "$W/summary.json" "$OUT/" 2>/dev/null
for r in quickstart five sweep20 seed000; do cp "$W/$r/gpu-memory.svg" "$OUT/$r-gpu-memory.svg" 2>/dev/null; done
tar -C "$W" --exclude='*.safetensors' -czf "$OUT/results.tar.gz" . 2>/dev/null
cat "$OUT/summary.md"
