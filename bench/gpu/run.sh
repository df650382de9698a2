#!/usr/bin/env bash
# The GPU benchmark, run on the device machine:
#   bench/gpu/run.sh BIN_DIR OUT_DIR
# BIN_DIR holds release builds of orchestrate and stage-worker (built elsewhere, against the
# torch 2.11 wheel) and a file COMMIT naming the commit they were built from; this host's
# PyTorch 2.11 provides libtorch. Plans and configs are read from the tree this script lies in
# (bench/gpu/plans, configs/, examples/accelerate), whatever the working directory.
#
# What runs (each measured part REPS times, default 3, one after another on the same GPU):
#   - the quickstart (configs/quickstart.toml);
#   - the five-stage headline pair: 5 training stages in one Python process
#     (one_process_stages.py) and the same 5 under orchestrate (plans/five-stages.toml);
#   - reclaim + handoff: a chain of HOLDERS stage-worker holders each of 1, 8 and 64 GiB
#     (stages that write no checkpoint);
#   - seed 001's loop: a SAMPLES-sample sweep (base + SAMPLES fine-tunes + SAMPLES evals) under
#     orchestrate, and the same SAMPLES fine-tunes in one Python process keeping references;
#   - seed 000 with Accelerate (configs/seed000-accelerate.toml): SEED000_REPS times (default 1);
#   - the two leak fixtures: once each (pass/fail checks, not measurements).
# Defaults: REPS=3, HOLDERS=3, SAMPLES=2, SEED000_REPS=1 (sized to fit one 9-minute device call).
# BUDGET_S (default 500): a part is not started when the time spent so far plus its expected
# length would pass it; a skipped part is logged and shows as fewer reps in the summary.
#
# Everything lands in OUT_DIR: log.txt, machine.txt, summary.md/json (summarize.py),
# results.tar.gz (reports, journals, timelines, pictures, logs; no checkpoints) and the
# rep-1 pictures.
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$BIN:$PATH"
REPS=${REPS:-3}; SEED000_REPS=${SEED000_REPS:-1}; HOLDERS=${HOLDERS:-3}; SAMPLES=${SAMPLES:-2}
BUDGET_S=${BUDGET_S:-500}
# PARTS selects what runs (default: all): core (quickstart, headline pair, reclaim + handoff),
# sweep (seed 001's loop), leaks (the two fixtures), seed000 (the Accelerate pipeline).
PARTS=${PARTS:-core sweep leaks seed000}
want() { case " $PARTS " in *" $1 "*) return 0;; esac; return 1; }
W=/tmp/gpu-bench; rm -rf "$W"; mkdir -p "$W"
START=$(date +%s)
LOG="$OUT/log.txt"
log() { echo "== $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s $*" | tee -a "$LOG"; }
# fits SECONDS: true when a part expected to take SECONDS still fits in the budget.
fits() {
  local spent=$(( $(date +%s) - START ))
  if [ $(( spent + $1 )) -gt "$BUDGET_S" ]; then log "skipped (budget: ${spent}s spent, ~$1s needed, budget ${BUDGET_S}s): $2"; return 1; fi
  return 0
}
# orch NAME PLAN: one orchestrate run into $W/NAME, its exit status in $W/NAME.exit, wall in .wall
orch() {
  local t0; t0=$(date +%s.%N)
  timeout 300 orchestrate --plan "$2" --run-dir "$W/$1" -q >> "$LOG" 2>&1; echo "exit $?" > "$W/$1.exit"
  awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN{printf "%.3f\n", a-b}' > "$W/$1.wall"
  find "$W/$1" -name '*.safetensors' -delete 2>/dev/null  # checksummed in the report; frees disk
}

{
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host $(hostname)"
  echo "gpu $(nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv,noheader)"
  python3 -c 'import torch;print("torch", torch.__version__)'
  echo "binary_commit $(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)"
  echo "orchestrate_sha256 $(sha256sum "$BIN/orchestrate" | cut -d' ' -f1)"
  echo "stage_worker_sha256 $(sha256sum "$BIN/stage-worker" | cut -d' ' -f1)"
  echo "parts $PARTS"
  echo "reps $REPS seed000_reps $SEED000_REPS holders $HOLDERS samples $SAMPLES budget_s $BUDGET_S"
} > "$W/machine.txt" 2>&1
cat "$W/machine.txt" | tee -a "$LOG"
python3 "$HERE/make_plans.py" "$W/plans" --holders "$HOLDERS" --samples "$SAMPLES"

leaks() {
  log "leak fixture: GPU-holding grandchild (once)"
  orch leak-grandchild "$HERE/plans/leak-grandchild.toml"
  log "leak fixture: outside process (once)"
  export LEAK_SIGNAL="$W/leak-signal"; rm -f "$LEAK_SIGNAL"
  timeout 120 orchestrate --plan "$HERE/plans/leak-outside.toml" --run-dir "$W/leak-outside" -q >> "$LOG" 2>&1 & ORCH=$!
  for _ in $(seq 400); do [ -f "$LEAK_SIGNAL" ] && break; sleep 0.05; done
  stage-worker hold --gib 4 --seconds 20 > "$W/outside-holder.log" 2>&1 & HOLDER=$!
  echo "$HOLDER" > "$W/outside-holder.pid"
  wait $ORCH; echo "exit $?" > "$W/leak-outside.exit"
  kill $HOLDER 2>/dev/null; wait $HOLDER 2>/dev/null
}

# Rep 1 of every measured part, then the once-only parts (leak fixtures, seed 000 up to
# SEED000_REPS), then the remaining reps: a tight budget costs the last reps, not whole parts.
for r in $(seq "$REPS"); do
  mkdir -p "$W/rep$r"
  if want core; then
  fits 16 "rep $r quickstart" && { log "rep $r: quickstart"; orch "rep$r/quickstart" "$ROOT/configs/quickstart.toml"; }
  if fits 90 "rep $r headline pair"; then
    log "rep $r: headline: 5 stages in one Python process with a stray reference"
    timeout 200 python3 "$HERE/one_process_stages.py" --stray-reference --d-model 1024 --layers 8 --heads 16 --batch 32 --seq 256 --steps 50 > "$W/rep$r/one_process.json" 2> "$W/rep$r/one_process.err"
    log "rep $r: headline: the same 5 stages under orchestrate"
    orch "rep$r/five" "$HERE/plans/five-stages.toml"
  fi
  fits $(( 3 * HOLDERS + 3 )) "rep $r reclaim+handoff" && { log "rep $r: reclaim + handoff: $HOLDERS holders each of 1, 8, 64 GiB"; orch "rep$r/reclaim" "$W/plans/reclaim.toml"; }
  fi
  if want sweep && fits $(( 28 + 8 * SAMPLES )) "rep $r sweep"; then
    log "rep $r: seed 001's loop: $SAMPLES fine-tune + eval instances under orchestrate"
    orch "rep$r/sweep" "$W/plans/sweep.toml"
    log "rep $r: seed 001's loop: the same $SAMPLES in one Python process keeping its references"
    timeout 200 python3 "$HERE/one_process_stages.py" --stray-reference --stages "$SAMPLES" --d-model 512 --layers 4 --heads 8 --batch 32 --seq 128 --steps 50 --eval-batches 4 > "$W/rep$r/one_process_sweep.json" 2> "$W/rep$r/one_process_sweep.err"
  fi
  if [ "$r" = 1 ]; then
    want leaks && fits 12 "leak fixtures" && leaks
    want seed000 && for s in $(seq "$SEED000_REPS"); do
      mkdir -p "$W/rep$s"
      fits 66 "rep $s seed 000" && { log "rep $s: seed 000: pretrain → SFT with Accelerate, as two stages"; orch "rep$s/seed000" "$ROOT/configs/seed000-accelerate.toml"; }
    done
  fi
done

log "summary"
python3 "$HERE/summarize.py" "$W" > "$OUT/summary.md" 2> "$W/summarize.err" || cat "$W/summarize.err" | tee -a "$LOG"
cp "$W/summary.json" "$OUT/" 2>/dev/null
# at most 8 files come back from the device: the pictures of rep 1 are also in results.tar.gz
for r in five sweep; do cp "$W/rep1/$r/gpu-memory.svg" "$OUT/$r-gpu-memory.svg" 2>/dev/null; done
cp "$LOG" "$W/log.txt"
tar -C "$W" --exclude='*.safetensors' -czf "$OUT/results.tar.gz" . 2>/dev/null
log "done"
cat "$OUT/summary.md"
