#!/usr/bin/env bash
# On the H200: a daemon with --http runs a 3-stage GPU plan; everything the web view serves for
# that run is saved under $OUT (the run as the page reads it: runs list, run, memory, events,
# logs, /metrics), with the GPU's identity, so the page can be rendered from it elsewhere.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
torchlib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export LD_LIBRARY_PATH=$torchlib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
w=$(mktemp -d); cap=$OUT/capture; mkdir -p "$cap"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv > "$cap/gpu.csv" 2>&1
date -u +%Y-%m-%dT%H:%M:%SZ > "$cap/date.txt"
cp "$here/commit.txt" "$cap/" 2>/dev/null
cat > "$w/plan.toml" <<PLAN
[run]
name = "h200-web"
[[stage]]
name = "warmup"
gpus = 1
command = ["python3", "$here/stage.py", "4", "4"]
[[stage]]
name = "train"
gpus = 1
after = ["warmup"]
command = ["python3", "$here/stage.py", "8", "6"]
[[stage]]
name = "eval"
gpus = 1
after = ["train"]
command = ["python3", "$here/stage.py", "3", "10"]
PLAN
"$here/orchestrate" daemon --socket "$w/sock/d.sock" --runs-dir "$w/runs" --http 127.0.0.1:18765 2> "$cap/daemon.log" &
dpid=$!
for i in $(seq 100); do [[ -S $w/sock/d.sock && -f $w/sock/d.sock.web-token ]] && break; sleep 0.1; done
"$here/orchestrate" submit "$w/plan.toml" --socket "$w/sock/d.sock" --wait > "$cap/submit.txt" 2>&1
echo "submit rc=$?" >> "$cap/submit.txt"
python3 - "$w" "$cap" <<'PY'
import json, sys, urllib.request
w, cap = sys.argv[1], sys.argv[2]
token = open(w + "/sock/d.sock.web-token").read().strip()
def get(path):
    r = urllib.request.Request("http://127.0.0.1:18765" + path, headers={"Authorization": "Bearer " + token})
    return urllib.request.urlopen(r, timeout=60).read()
runs = get("/api/runs"); open(cap + "/runs.json", "wb").write(runs)
rid = json.loads(runs)["runs"][0]["info"]["id"]; open(cap + "/run_id.txt", "w").write(rid)
open(cap + "/run.json", "wb").write(get(f"/api/runs/{rid}"))
open(cap + "/memory.json", "wb").write(get(f"/api/runs/{rid}/memory"))
open(cap + "/events.sse", "wb").write(get(f"/api/runs/{rid}/events"))
open(cap + "/metrics.txt", "wb").write(get("/metrics"))
for s in ("warmup", "train", "eval"):
    for stream in ("stderr", "stdout"):
        open(f"{cap}/log-{s}-{stream}.txt", "wb").write(get(f"/api/runs/{rid}/stages/{s}/log?stream={stream}"))
PY
kill -TERM $dpid; wait $dpid
cp "$w"/runs/*/report.json "$w"/runs/*/gpu-memory.svg "$w"/runs/*/gpu-timeline.csv "$w"/runs/*/events.jsonl "$cap/" 2>/dev/null
command -v chromium >/dev/null && echo "chromium present" > "$cap/chromium.txt" || echo "no chromium on the device" > "$cap/chromium.txt"
tar -C "$OUT" -czf "$OUT/capture.tgz" capture && rm -rf "$cap"
ls -la "$OUT"
