#!/usr/bin/env bash
# Hangs on a GPU, run on the device machine from the repository root:
#   bench/hang/gpu.sh BIN_DIR OUT_DIR
# 1. A Python stage that reports two steps, then spins in a CUDA kernel for ever
#    (torch.cuda._sleep): it must be `hung` within its stall_timeout (10 s) and a look's period,
#    with its Python stack saved, and the GPU back at its baseline; the next stage on that GPU
#    runs. py-spy: BIN_DIR/py-spy (carried: the device has no package index) or on PATH.
# 2. The stall detector's cost: the built-in 100M train stage with stall_timeout "off" and "1m",
#    alternating, REPEATS (3) times each; tokens/s of each.
# BIN_DIR holds stripped release builds of orchestrate and stage-worker and COMMIT.
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/../machine.sh"
bench_setup
W=${BENCH_WORK:-/tmp/hang-bench}; rm -rf "$W"; mkdir -p "$W"
machine_info "$BIN" > "$OUT/machine.txt"; cat "$OUT/machine.txt"
# py-spy: BIN_DIR/py-spy when carried there (the device has no package index), else on PATH.
[ -x "$BIN/py-spy" ] && export ORCHESTRATE_PY_SPY="$BIN/py-spy"
echo "py-spy: ${ORCHESTRATE_PY_SPY:-$(command -v py-spy || echo none)}" | tee -a "$OUT/machine.txt"
cat > "$W/spin.py" <<'PY'
import torch, orchestrate_stage as stage
x = torch.ones(1, device="cuda")
stage.started(device="cuda")
for step in (1, 2):
    x = x * 2
    torch.cuda.synchronize()
    stage.progress(step, total_steps=10)
torch.cuda._sleep(1 << 62)  # a kernel that spins for ever: the device busy, no progress
torch.cuda.synchronize()
PY
cat > "$W/after.py" <<'PY'
import torch
x = torch.ones(1 << 20, device="cuda")
print("after: ran on", torch.cuda.get_device_name(), float(x.sum()))
PY
cat > "$W/hang.toml" <<EOF2
[[stage]]
name = "spin"
command = ["python3", "$W/spin.py"]
gpus = 1
stall_timeout = "10s"
timeout = "5m"
env = { PYTHONPATH = "$ROOT/python" }

[[stage]]
name = "after"
after_failure_ok = false
command = ["python3", "$W/after.py"]
gpus = 1
EOF2
# `after` must not depend on spin (spin fails): it is a separate stage that waits for the GPU.
sed -i '/after_failure_ok/d' "$W/hang.toml"
START=$(date +%s.%N)
"$BIN/orchestrate" --plan "$W/hang.toml" --run-dir "$W/hang-run" > "$OUT/hang-console.txt" 2>&1
echo "exit: $?  wall: $(python3 -c "import time;print(round(time.time()-$START,1))") s" | tee -a "$OUT/hang-console.txt"
cp "$W/hang-run/report.json" "$OUT/hang-report.json"
cp -r "$W/hang-run/stages/spin/hung-1" "$OUT/hung-1" 2>/dev/null
python3 - "$OUT/hang-report.json" <<'PY' | tee "$OUT/hang-summary.txt"
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["stages"]:
    t = s.get("timing") or {}
    print(s["name"], s["status"], s.get("failure"), "|", (s.get("error") or "")[:300])
    for g in s.get("gpu", []):
        print("  gpu", g["uuid"], g["verdict"], "baseline", g["baseline_bytes"] >> 20, "MiB after", g["after_bytes"] >> 20, "MiB reclaim", g["reclaim_ms"], "ms")
    if t:
        print("  spawned→exited %.1f s" % (t["exited"] - t["spawned"]))
PY
# The stall detector's cost on a 100M train stage.
for r in $(seq 1 "${REPEATS:-3}"); do
  for st in off 1m; do
    cat > "$W/t-$st-$r.toml" <<EOF2
[run]
stall_timeout = "$st"
gpu_tolerance_mib = 64
[[stage]]
name = "train"
kind = "train"
[stage.params]
data = "synthetic:pretrain"
steps = 300
batch_size = 32
seq_len = 256
model = { d_model = 1024, n_layers = 8, n_heads = 16, max_seq_len = 256 }
EOF2
    "$BIN/orchestrate" --plan "$W/t-$st-$r.toml" --run-dir "$W/t-$st-$r" --worker "$BIN/stage-worker" -q > /dev/null 2>&1
    python3 -c "import json;s=json.load(open('$W/t-$st-$r/report.json'))['stages'][0];print('$st', $r, s['status'], s['metrics'].get('tokens_per_s'))" | tee -a "$OUT/stall-overhead.txt"
    rm -rf "$W/t-$st-$r"
  done
done
rm -rf "$W"
