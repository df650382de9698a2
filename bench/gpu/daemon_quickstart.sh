#!/usr/bin/env bash
# The quickstart on a GPU through the daemon, with the merged build (fork server, Host, daemon):
#   bench/gpu/daemon_quickstart.sh BIN_DIR OUT_DIR
# Submits configs/quickstart.toml twice at once (two runs sharing the host's GPUs) and writes
# summary.json (per stage: status, wall, GPU verdict, reclaim, key metrics).
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$BIN:$PATH"
W=/tmp/daemon-qs; rm -rf "$W"; mkdir -p "$W"
{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader; } > "$W/machine.txt"
SOCK="$W/sock/d.sock"
orchestrate daemon --socket "$SOCK" --runs-dir "$W/runs" > "$W/daemon.log" 2>&1 & D=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done
A=$(orchestrate submit --socket "$SOCK" configs/quickstart.toml 2>/dev/null)
B=$(orchestrate submit --socket "$SOCK" configs/quickstart.toml 2>/dev/null)
orchestrate wait --socket "$SOCK" "$A" > "$W/a.wait"; echo "a $?" >> "$W/exits"
orchestrate wait --socket "$SOCK" "$B" > "$W/b.wait"; echo "b $?" >> "$W/exits"
orchestrate shutdown --socket "$SOCK"; wait $D
python3 - "$W" "$A" "$B" > "$OUT/summary.json" <<'PY'
import json, os, sys
w, ids = sys.argv[1], sys.argv[2:]
out = {"machine": open(os.path.join(w, "machine.txt")).read().strip().splitlines(),
       "exits": open(os.path.join(w, "exits")).read().split(), "runs": {}}
for i in ids:
    r = json.load(open(os.path.join(w, "runs", i, "report.json")))
    out["runs"][i] = {"status": r["status"], "wall_s": r["wall_s"], "stages": [
        {"stage": s["name"], "status": s["status"], "wall_s": s["wall_s"],
         "gpu": [(g["uuid"], g["verdict"], round(g["reclaim_ms"], 3), g["baseline_bytes"] >> 20, g["after_bytes"] >> 20) for g in s["gpu"]],
         "metrics": {k: v for k, v in s["metrics"].items() if k in ("accuracy", "final_loss", "tokens_per_s")}}
        for s in r["stages"]]}
print(json.dumps(out, indent=1))
PY
cat "$OUT/summary.json"
tar czf "$OUT/results.tar.gz" --exclude='*.safetensors' -C "$W" . 2>/dev/null
