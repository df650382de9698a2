#!/usr/bin/env bash
# XID and health-gate check on a lent GPU (issue 46, item 4).
#
#   BIN_DIR=/path/to/release/bins OUT=/path/to/out bench/xid/gpu.sh
#
# 1. A plan of two stages on GPU 0's node: `fault`, whose kernel stores to address 0x10 (PTX
#    through the driver API, bench/xid/illegal_store.py), then `next`, which takes every GPU of
#    the machine (so the faulting one too) and runs a CUDA tensor. Expected: `fault` failed with
#    XID 31 in its GPU verdict (meaning, recovery action, needs_reset false), `next` succeeded on
#    the same GPU (31 needs no reset), no GPU quarantined.
# 2. The health gate's NVML reads per GPU, median and range over 5 runs (bench/xid/gate_cost.py).
# 3. A one-rank NCCL stage that reports three steps and then hangs (bench/xid/nccl_hang.py,
#    stall_timeout 10s): expected `hung`, with `nccl-trace-rank-0` (PyTorch's flight recorder
#    dump, asked for through TORCH_NCCL_DEBUG_INFO_PIPE_FILE) in its hung-1 folder.
# Everything goes under $OUT; a summary is printed at the end.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
: "${BIN_DIR:?BIN_DIR: the release orchestrate and stage-worker}" "${OUT:?OUT: where results go}"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
NGPU=$(nvidia-smi -L | wc -l)
{ date -u +%FT%TZ; nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv,noheader; } > "$OUT/machine.txt"
cat > "$OUT/plan.toml" <<PLAN
[run]
max_parallel = 1
gpu_check = "required"

[[stage]]
name = "fault"
gpus = 1
command = ["$PY", "$HERE/illegal_store.py"]

[[stage]]
name = "next"
gpus = $NGPU
command = ["$PY", "-c", "import os, torch; print(os.environ['ORCHESTRATE_GPU_UUIDS'], torch.ones(1, device='cuda').sum().item())"]
PLAN
"$BIN_DIR/orchestrate" --plan "$OUT/plan.toml" --run-dir "$OUT/run" > "$OUT/orchestrate.out" 2> "$OUT/orchestrate.err"
echo "orchestrate exit: $? (1 expected: fault failed)" > "$OUT/summary.txt"
"$PY" - "$OUT/run/report.json" >> "$OUT/summary.txt" <<'PYEOF'
import json, sys
report = json.load(open(sys.argv[1]))
for s in report["stages"]:
    gpus = s.get("gpu") or []
    print(f"{s['name']}: {s['status']} {s.get('failure') or ''} {s.get('error') or ''}")
    for g in gpus:
        print(f"  {g['uuid']}: {g['verdict']} after {g['after_bytes'] >> 20} MiB (baseline {g['baseline_bytes'] >> 20}); xids: {[(x['xid'], x['meaning'], x['needs_reset'], x['action']) for x in g.get('xids', [])]}")
fault = next(s for s in report["stages"] if s["name"] == "fault")
nxt = next(s for s in report["stages"] if s["name"] == "next")
xids = [x["xid"] for g in fault.get("gpu") or [] for x in g.get("xids", [])]
fault_gpu = (fault.get("gpu") or [{}])[0].get("uuid")
print("CHECK fault has XID 31:", 31 in xids)
print("CHECK next ran on the faulting GPU and succeeded:", nxt["status"] == "succeeded" and fault_gpu in [g["uuid"] for g in nxt.get("gpu") or []])
PYEOF
grep -h "XID\|quarantined" "$OUT/orchestrate.err" >> "$OUT/summary.txt"
"$PY" "$HERE/gate_cost.py" 5 >> "$OUT/summary.txt" 2>&1
cat > "$OUT/nccl.toml" <<PLAN
[[stage]]
name = "nccl_hang"
gpus = 1
stall_timeout = "10s"
command = ["$PY", "$HERE/nccl_hang.py"]
PLAN
"$BIN_DIR/orchestrate" --plan "$OUT/nccl.toml" --run-dir "$OUT/nccl-run" > "$OUT/nccl.out" 2> "$OUT/nccl.err"
echo "nccl run exit: $? (1 expected: hung)" >> "$OUT/summary.txt"
grep -h "hung:" "$OUT/nccl.err" | head -3 >> "$OUT/summary.txt"
ls -la "$OUT/nccl-run/stages/nccl_hang/hung-1/" >> "$OUT/summary.txt" 2>&1
if [ -s "$OUT/nccl-run/stages/nccl_hang/hung-1/nccl-trace-rank-0" ]; then
  echo "CHECK NCCL flight recorder dumped: True" >> "$OUT/summary.txt"
else
  echo "CHECK NCCL flight recorder dumped: False" >> "$OUT/summary.txt"
fi
cat "$OUT/summary.txt"
