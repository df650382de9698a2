#!/usr/bin/env bash
# Issue 49 on a GPU machine: the web view's machine panel reads each GPU's utilisation through
# NVML. A daemon with --http runs one stage that keeps GPU 0 busy with matmuls for ~12 s; while it
# runs, the runs list's event stream (/api/events) is read and its `event: machine` frames are
# kept. Passes when a frame shows GPU 0 with a utilisation above 0 and memory in use above its
# idle baseline, and every GPU has a utilisation (NVML answered).
#
#   BIN_DIR=target/release OUT=/tmp/out bench/web/machine/gpu.sh
#
# Needs: $BIN_DIR/orchestrate, python3 with torch (CUDA). Writes everything under $OUT.
set -uo pipefail
: "${BIN_DIR:?the directory of the release binaries}" "${OUT:?where to write}"
mkdir -p "$OUT"
w=$(mktemp -d)
cat > "$w/busy.py" <<'PY'
import time, torch
x = torch.randn(8192, 8192, device="cuda")
end = time.time() + 12
while time.time() < end:
    y = x @ x
    torch.cuda.synchronize()
print("done", float(y[0, 0]))
PY
cat > "$w/plan.toml" <<PLAN
[run]
name = "machine-panel"
[[stage]]
name = "busy"
gpus = 1
command = ["python3", "$w/busy.py"]
PLAN
port=18766
"$BIN_DIR/orchestrate" daemon --socket "$w/sock/d.sock" --runs-dir "$w/runs" --http 127.0.0.1:$port 2> "$OUT/daemon.log" &
dpid=$!
for _ in $(seq 100); do [[ -S $w/sock/d.sock && -f $w/sock/d.sock.web-token ]] && break; sleep 0.1; done
id=$("$BIN_DIR/orchestrate" submit "$w/plan.toml" --socket "$w/sock/d.sock" 2> "$OUT/submit.txt")
python3 - "$w" "$OUT" "$port" <<'PY'
import json, sys, time, urllib.request
w, out, port = sys.argv[1], sys.argv[2], sys.argv[3]
token = open(w + "/sock/d.sock.web-token").read().strip()
req = urllib.request.Request(f"http://127.0.0.1:{port}/api/events", headers={"Authorization": "Bearer " + token})
frames, kind = [], None
with urllib.request.urlopen(req, timeout=30) as stream:
    end = time.time() + 10
    for raw in stream:
        line = raw.decode().rstrip("\n")
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: ") and kind == "machine":
            frames.append(json.loads(line[6:]))
        if time.time() > end:
            break
json.dump(frames, open(out + "/machine-frames.json", "w"), indent=1)
gpus = [g for f in frames for g in f["gpus"]]
busy = [g for g in gpus if (g["utilization"] or 0) > 0 and g["used_bytes"] and g["used_bytes"] > (g["baseline_bytes"] or 0)]
every = frames and all(g["utilization"] is not None for g in frames[-1]["gpus"])
print(f"machine frames: {len(frames)}; GPUs in the last: {len(frames[-1]['gpus']) if frames else 0}")
for g in (frames[-1]["gpus"] if frames else []):
    print(f"  {g['uuid']} {g['name']}: {g['used_bytes']} of {g['total_bytes']} bytes, utilisation {g['utilization']} %, baseline {g['baseline_bytes']}")
print("max utilisation seen:", max([g["utilization"] or 0 for g in gpus], default=None))
print("PASS" if busy and every else "FAIL: no frame showed a busy GPU with its utilisation")
sys.exit(0 if busy and every else 1)
PY
rc=$?
"$BIN_DIR/orchestrate" wait "$id" --socket "$w/sock/d.sock" >> "$OUT/submit.txt" 2>&1
kill -TERM $dpid; wait $dpid
exit $rc
