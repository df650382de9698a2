#!/usr/bin/env bash
# The daemon on a 2-GPU host (device kind nvidia-h200-x2), from the repository root:
#   bench/gpu/daemon_x2.sh BIN_DIR OUT_DIR
# 1. two runs submitted at once, each two GPU stages (4 GiB held 4 s): their stages run on
#    both GPUs in parallel, every verdict clean;
# 2. a foreign process holds 8 GiB on GPU index 0: two more stages both go to the other GPU,
#    one after the other, and the waiting one's reason names the holder.
# Writes summary.json and results.tar.gz (reports, journals, events) to OUT_DIR.
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
export PATH="$BIN:$PATH"
W=/tmp/daemon-x2; rm -rf "$W"; mkdir -p "$W"
{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader; } > "$W/machine.txt" 2>&1
cat "$W/machine.txt"
SOCK="$W/sock/d.sock"
orchestrate daemon --socket "$SOCK" --runs-dir "$W/runs" > "$W/daemon.log" 2>&1 & DAEMON=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && break; sleep 0.1; done

plan() { # name stages secs
  local name=$1 n=$2 secs=$3
  echo "[run]"; echo "name = \"$name\""
  for i in $(seq 1 "$n"); do
    echo "[[stage]]"; echo "name = \"s$i\""; echo "gpus = 1"
    echo "command = [\"python3\", \"$HERE/hold_gpu.py\", \"4\", \"$secs\"]"
    echo "outputs = [\"where.json\"]"
    [ "$i" -gt 1 ] && [ "${CHAIN:-1}" = 1 ] && echo "after = [\"s$((i-1))\"]"
  done
}
plan a 2 4 > "$W/a.toml"; plan b 2 4 > "$W/b.toml"
A=$(orchestrate submit --socket "$SOCK" "$W/a.toml" 2>/dev/null)
B=$(orchestrate submit --socket "$SOCK" "$W/b.toml" 2>/dev/null)
orchestrate wait --socket "$SOCK" "$A" > "$W/a.wait"; echo "a exit $?" >> "$W/exits"
orchestrate wait --socket "$SOCK" "$B" > "$W/b.wait"; echo "b exit $?" >> "$W/exits"

# A foreign process on GPU index 0 (by UUID, as NVML names it).
G0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
CUDA_VISIBLE_DEVICES=$G0 python3 "$HERE/hold_gpu.py" 8 40 > "$W/foreign.log" 2>&1 & FOREIGN=$!
echo "$FOREIGN" > "$W/foreign.pid"
for _ in $(seq 200); do nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 0 | grep -q . && break; sleep 0.1; done
CHAIN=0 plan c 2 3 > "$W/c.toml"
C=$(orchestrate submit --socket "$SOCK" "$W/c.toml" 2>/dev/null)
orchestrate watch --socket "$SOCK" --json "$C" > "$W/c.events.jsonl"; echo "c exit $?" >> "$W/exits"
kill "$FOREIGN" 2>/dev/null; wait "$FOREIGN" 2>/dev/null
orchestrate shutdown --socket "$SOCK"; wait $DAEMON

python3 - "$W" "$A" "$B" "$C" "$FOREIGN" > "$OUT/summary.json" <<'PY'
import json, sys, os
w, a, b, c, foreign = sys.argv[1:]
def rep(i): return json.load(open(os.path.join(w, "runs", i, "report.json")))
def where(i, s): return json.load(open(os.path.join(w, "runs", i, "stages", s, "output", "where.json")))
out = {"machine": open(os.path.join(w, "machine.txt")).read().strip().splitlines(),
       "exits": open(os.path.join(w, "exits")).read().split("\n")[:-1], "runs": {}}
for name, i in (("a", a), ("b", b), ("c", c)):
    r = rep(i)
    out["runs"][name] = {"id": i, "status": r["status"], "stages": [
        {"stage": s["name"], "status": s["status"], "gpu": [g["uuid"] for g in s["gpu"]],
         "verdicts": [g["verdict"] for g in s["gpu"]], "reclaim_ms": [g["reclaim_ms"] for g in s["gpu"]],
         "baseline_mib": [g["baseline_bytes"] >> 20 for g in s["gpu"]],
         "peak_mib": [g["peak_bytes"] >> 20 for g in s["gpu"]],
         "after_mib": [g["after_bytes"] >> 20 for g in s["gpu"]],
         "ran": where(i, s["name"])} for s in r["stages"]]}
# Parallel: a.s1 and b.s1 overlap in time on different GPUs.
a1, b1 = out["runs"]["a"]["stages"][0], out["runs"]["b"]["stages"][0]
out["parallel_first_stages"] = (a1["gpu"] != b1["gpu"] and a1["ran"]["start"] < b1["ran"]["end"]
                                and b1["ran"]["start"] < a1["ran"]["end"])
waits = [json.loads(l) for l in open(os.path.join(w, "c.events.jsonl"))]
reasons = [e["event"]["reason"] for e in waits if e.get("type") == "event" and e["event"]["event"] == "stage_waiting"]
out["foreign_pid"] = int(foreign)
out["waiting_reasons"] = reasons
out["waiting_names_holder"] = any(f"pid {foreign}" in r for r in reasons)
out["all_clean"] = all(v == "clean" for run in out["runs"].values() for s in run["stages"] for v in s["verdicts"])
print(json.dumps(out, indent=1))
PY
cat "$OUT/summary.json"
tar czf "$OUT/results.tar.gz" -C "$W" . 2>/dev/null
