#!/usr/bin/env bash
# Seed 001's sweep across every GPU of one host, every instance verified (issue: multi-GPU
# sweep). From the repository root on the device machine:
#   bench/gpu/multi_gpu.sh BIN_DIR OUT_DIR [SAMPLES]
# BIN_DIR holds release builds of orchestrate and stage-worker. The GPU count comes from NVML
# (nvidia-smi). Parts:
#  1. the sweep (base model, then fine-tune + eval per sample, SAMPLES samples, default 64) on
#     all GPUs at once (max_parallel = GPU count), and the same sweep one stage at a time (one
#     GPU busy at a time): wall times, verdicts, memory after every instance;
#  2. one Python process per GPU running its share of the samples and keeping its references:
#     memory growth per GPU (the leak the sweep avoids);
#  3. a torchrun --nproc-per-node=N DDP stage on all GPUs: one verdict per GPU;
#  4. a foreign process holding 8 GiB on GPU 0 while a 10-sample sweep runs: no instance goes
#     to GPU 0 while it is held, the waiting reason names the holder, the sweep finishes.
# Writes summary.json, the sweep's gpu-memory.svg and results.tar.gz to OUT_DIR.
set -uo pipefail
BIN=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd); SAMPLES=${3:-64}
HERE=$(cd "$(dirname "$0")" && pwd)
TORCH_LIB=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$BIN:$PATH"
W=/tmp/multi-gpu; rm -rf "$W"; mkdir -p "$W"
N=$(nvidia-smi -L | wc -l)
{ date -u +%Y-%m-%dT%H:%M:%SZ; nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader; } > "$W/machine.txt"
cat "$W/machine.txt"; echo "GPUs: $N"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$W/log.txt"; }

python3 - "$W" "$SAMPLES" "$N" "$HERE" <<'PY'
import os, sys
w, samples, n, here = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, here)
from benchplans import sweep_plan, write_samples
write_samples(w, samples)
for file, name, parallel, glob in [("sweep-all", "sweep-all-gpus", n, "samples/*.jsonl"),
                                   ("sweep-one", "sweep-one-at-a-time", 1, "samples/*.jsonl"),
                                   ("sweep-foreign", "sweep-foreign", n, "samples/sample-0?.jsonl")]:
    with open(os.path.join(w, file + ".toml"), "w") as f:
        f.write(sweep_plan(name, glob, max_parallel=parallel, gpus=True))
open(os.path.join(w, "ddp.toml"), "w").write(f"""[run]
name = "ddp"
[[stage]]
name = "ddp"
gpus = {n}
command = ["torchrun", "--standalone", "--nproc-per-node={n}", "{os.path.join(here, 'ddp_stage.py')}"]
outputs = ["model.pt"]
env = {{ NCCL_NVLS_ENABLE = "0" }}
""")
PY
cat "$W/ddp.toml"

log "1a. sweep of $SAMPLES samples on all $N GPUs"
t0=$(date +%s.%N); orchestrate --plan "$W/sweep-all.toml" --run-dir "$W/sweep-all" -q > "$W/sweep-all.out" 2>&1; echo "all exit $?" >> "$W/exits"; t1=$(date +%s.%N)
echo "$t0 $t1" > "$W/sweep-all.wall"
log "1b. the same sweep one stage at a time"
t0=$(date +%s.%N); orchestrate --plan "$W/sweep-one.toml" --run-dir "$W/sweep-one" -q > "$W/sweep-one.out" 2>&1; echo "one exit $?" >> "$W/exits"; t1=$(date +%s.%N)
echo "$t0 $t1" > "$W/sweep-one.wall"

log "2. one Python process per GPU keeping its references"
PER=$(( (SAMPLES + N - 1) / N ))
for i in $(seq 0 $((N-1))); do
  CUDA_VISIBLE_DEVICES=$i python3 "$HERE/one_process_stages.py" --stray-reference --stages "$PER" --d-model 512 --layers 4 --heads 8 --batch 32 --seq 128 --steps 50 --eval-batches 4 > "$W/one_process_gpu$i.json" 2> "$W/one_process_gpu$i.err" &
done
wait

log "3. torchrun DDP stage on $N GPUs"
orchestrate --plan "$W/ddp.toml" --run-dir "$W/ddp" -q > "$W/ddp.out" 2>&1; echo "ddp exit $?" >> "$W/exits"

log "4. a foreign process holding GPU 0 during a 10-sample sweep"
G0=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
CUDA_VISIBLE_DEVICES=$G0 python3 "$HERE/hold_gpu.py" 8 25 > "$W/foreign.log" 2>&1 & FOREIGN=$!
echo "$FOREIGN" > "$W/foreign.pid"
for _ in $(seq 300); do nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 0 | grep -q . && break; sleep 0.1; done
date +%s.%N > "$W/foreign.start"
orchestrate --plan "$W/sweep-foreign.toml" --run-dir "$W/sweep-foreign" > "$W/sweep-foreign.out" 2>&1; echo "foreign exit $?" >> "$W/exits"
wait "$FOREIGN"; date +%s.%N > "$W/foreign.end"

python3 - "$W" "$N" > "$OUT/summary.json" <<'PY'
import json, os, sys
w, n = sys.argv[1], int(sys.argv[2])
def rep(d): return json.load(open(os.path.join(w, d, "report.json")))
def wall(name):
    a, b = map(float, open(os.path.join(w, name + ".wall")).read().split()); return b - a
out = {"machine": open(os.path.join(w, "machine.txt")).read().strip().splitlines(), "gpus": n,
       "exits": open(os.path.join(w, "exits")).read().split("\n")[:-1]}
for name in ("sweep-all", "sweep-one"):
    r = rep(name)
    gpus = [g for s in r["stages"] for g in s["gpu"]]
    per_gpu = {}
    for s in r["stages"]:
        for g in s["gpu"]:
            per_gpu.setdefault(g["uuid"], 0)
            per_gpu[g["uuid"]] += 1
    out[name] = {"status": r["status"], "stages": len(r["stages"]), "wall_s": wall(name),
                 "verdicts": sorted({g["verdict"] for g in gpus}),
                 "stages_per_gpu": per_gpu,
                 "after_minus_baseline_mib_max": max((g["after_bytes"] - g["baseline_bytes"]) >> 20 for g in gpus),
                 "after_mib_range": [min(g["after_bytes"] >> 20 for g in gpus), max(g["after_bytes"] >> 20 for g in gpus)],
                 "reclaim_ms_max": max(g["reclaim_ms"] for g in gpus)}
out["speedup_all_vs_one"] = out["sweep-one"]["wall_s"] / out["sweep-all"]["wall_s"]
peers = {}
for i in range(n):
    try:
        peers[f"gpu{i}"] = json.load(open(os.path.join(w, f"one_process_gpu{i}.json")))
    except Exception as e:
        peers[f"gpu{i}"] = {"error": str(e)}
out["one_python_process_per_gpu"] = peers
d = rep("ddp")
out["ddp"] = {"status": d["status"], "gpu": [{"uuid": g["uuid"], "verdict": g["verdict"], "peak_mib": g["peak_bytes"] >> 20,
              "after_mib": g["after_bytes"] >> 20, "baseline_mib": g["baseline_bytes"] >> 20} for s in d["stages"] for g in s["gpu"]],
              "metrics": d["stages"][0]["metrics"]}
f = rep("sweep-foreign")
g0 = out["machine"][1].split(", ")[2]
# When the foreign process let go of GPU 0: its memory back under 2 GiB in the run's timeline.
import csv
jr = [json.loads(l) for l in open(os.path.join(w, "sweep-foreign", "journal.jsonl"))]
run_t0 = next(r["t"] for r in jr if r["rec"] == "run_started") / 1000
released = next((run_t0 + float(r["t_s"]) for r in csv.DictReader(open(os.path.join(w, "sweep-foreign", "gpu-timeline.csv")))
                 if r["uuid"] == g0 and int(r["used_bytes"]) < (2 << 30)), None)
on_g0_while_held = [s["name"] for s in f["stages"] if s.get("timing") and any(g["uuid"] == g0 for g in s["gpu"])
                    and (released is None or s["timing"]["spawned"] < released)]
text = open(os.path.join(w, "sweep-foreign.out")).read()
foreign = int(open(os.path.join(w, "foreign.pid")).read())
out["foreign"] = {"status": f["status"], "pid": foreign, "released_s_after_run_start": released and released - run_t0, "stages_started_on_gpu0_while_held": on_g0_while_held,
                  "waiting_lines": [l.strip() for l in text.splitlines() if "waiting for" in l][:5],
                  "reason_names_holder": f"pid {foreign}" in text,
                  "verdicts": sorted({g["verdict"] for s in f["stages"] for g in s["gpu"]})}
print(json.dumps(out, indent=1))
PY
cat "$OUT/summary.json"
cp "$W/sweep-all/gpu-memory.svg" "$OUT/sweep-all-gpu-memory.svg" 2>/dev/null
cp "$W/sweep-foreign/gpu-memory.svg" "$OUT/sweep-foreign-gpu-memory.svg" 2>/dev/null
tar czf "$OUT/results.tar.gz" --exclude='*.safetensors' --exclude='model.pt' -C "$W" . 2>/dev/null
