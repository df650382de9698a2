#!/usr/bin/env bash
# A/B of the CPU quickstart: two (or more) builds of `orchestrate` + `stage-worker` run
# configs/quickstart.toml in turn on the same cores, in one sitting, so that the machine and its
# load are the same for each. Answers "did the worker get slower on the CPU, or is it the
# machine?" (issue 31, item 8).
#
#   bench/cpu/ab.sh BIN_DIR OUT_DIR
#
# BIN_DIR holds one folder per build, each with `orchestrate`, `stage-worker` and a file
# `COMMIT` (one line: the commit it was built from). An arm is a build, optionally with worker
# variables: ARMS="old new new:STAGE_WORKER_CHECKSUM=sha256" (the default is every folder).
# Each repetition runs every arm once, the order rotated each time (REPS, default 3). EXTRA
# arms (same form) run after those, up to REPS times each. No run is started that would, at
# the length of the longest run so far, end after BUDGET_S seconds (default 480), so that a
# call on a lent machine ends inside its limit.
#
# The runs are pinned to CPUS (default: two CPUs on different cores), so a bigger machine
# stands in for a 2-core one; orchestrate then gives each built-in CPU stage the cores the way
# it does on a 2-core machine (OMP_NUM_THREADS must not be set). Every stage gets `gpus = 0`
# and CUDA_VISIBLE_DEVICES is empty, so a machine with a GPU runs the quickstart as one
# without does.
#
# Writes OUT_DIR/machine.json, OUT_DIR/runs.jsonl (one line a run), OUT_DIR/summary.json
# (median, min and max per arm) and OUT_DIR/console/<arm>-<rep>.txt (each run's console).
set -euo pipefail
BIN=$(cd "$1" && pwd)
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
PLAN_SRC=${PLAN:-$HERE/../../configs/quickstart.toml}
REPS=${REPS:-3}
BUDGET_S=${BUDGET_S:-480}
if [ -n "${OMP_NUM_THREADS:-}" ]; then
    echo "unset OMP_NUM_THREADS: orchestrate sets it per stage" >&2
    exit 2
fi
if [ -z "${ARMS:-}" ]; then
    ARMS=$(cd "$BIN" && for d in */; do printf '%s ' "${d%/}"; done)
fi
read -r -a arms <<<"$ARMS"
read -r -a extra <<<"${EXTRA:-}"

# Two CPUs that are not hyper-thread siblings of each other, unless CPUS says which.
if [ -z "${CPUS:-}" ]; then
    sib0=$(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list 2>/dev/null || echo 0)
    second=""
    for c in /sys/devices/system/cpu/cpu[0-9]*; do
        n=${c##*cpu}
        [ "$n" = 0 ] && continue
        if ! python3 -c "import sys
s=set()
for part in sys.argv[1].split(','):
    a,_,b=part.partition('-'); s.update(range(int(a),int(b or a)+1))
sys.exit(0 if int(sys.argv[2]) in s else 1)" "$sib0" "$n"; then
            second=$n
            break
        fi
    done
    CPUS="0,${second:-1}"
fi

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# The plan, every stage on the CPU.
python3 - "$PLAN_SRC" "$W/plan.toml" <<'PY'
import sys
out = []
for line in open(sys.argv[1]).read().splitlines():
    out.append(line)
    if line.strip() == "[[stage]]":
        out.append("gpus = 0")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY

python3 - "$OUT/machine.json" "$CPUS" "$BIN" "${arms[@]}" "${extra[@]}" <<'PY'
import hashlib, json, os, platform, subprocess, sys
path, cpus, bin_dir, arms = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except Exception as e:
        return f"({e})"
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
builds = {}
for d in sorted({a.split(":")[0] for a in arms}):
    f = os.path.join(bin_dir, d)
    builds[d] = {
        "commit": open(os.path.join(f, "COMMIT")).read().strip(),
        **{b: hashlib.sha256(open(os.path.join(f, b), "rb").read()).hexdigest()[:16]
           for b in ("orchestrate", "stage-worker")},
    }
json.dump({
    "date": sh("date -u +%Y-%m-%dT%H:%M:%SZ"),
    "host": platform.node(),
    "kernel": platform.release(),
    "cpu_model": model,
    "cpus_online": os.cpu_count(),
    "pinned_to": cpus,
    "load_average_at_start": open("/proc/loadavg").read().split()[:3],
    "ld_library_path": os.environ.get("LD_LIBRARY_PATH", ""),
    "builds": builds,
    "arms": arms,
}, open(path, "w"), indent=1)
PY
cat "$OUT/machine.json" >&2

mkdir -p "$OUT/console"
: >"$OUT/runs.jsonl"
start=$SECONDS
longest=0
one_run() { # arm rep
    local arm=$1 rep=$2 build=${1%%:*} vars=() tag t0 t1 rc=0 began=$SECONDS
    if ((SECONDS - start + longest > BUDGET_S)); then
        echo "skipped $arm rep $rep: the budget of ${BUDGET_S}s would be passed" >&2
        return
    fi
    [ "$arm" != "$build" ] && IFS=, read -r -a vars <<<"${arm#*:}"
    tag=$(echo "$arm" | tr -c 'A-Za-z0-9_.\n-' '_')
    rm -rf "$W/run"
    t0=$(date +%s.%N)
    env CUDA_VISIBLE_DEVICES= ORCHESTRATE_WORKER="$BIN/$build/stage-worker" "${vars[@]}" \
        taskset -c "$CPUS" "$BIN/$build/orchestrate" --plan "$W/plan.toml" --run-dir "$W/run" \
        >"$OUT/console/$tag-$rep.txt" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    ((SECONDS - began > longest)) && longest=$((SECONDS - began))
    python3 - "$W/run" "$arm" "$rep" "$rc" "$t0" "$t1" "$(cat /proc/loadavg)" >>"$OUT/runs.jsonl" <<'PY'
import json, pathlib, re, sys
run, arm, rep, rc, t0, t1, load = sys.argv[1:]
row = {"arm": arm, "rep": int(rep), "rc": int(rc), "outer_wall_s": round(float(t1) - float(t0), 3),
       "load_average_after": load.split()[:3]}
rp = pathlib.Path(run) / "report.json"
if rp.exists():
    r = json.loads(rp.read_text())
    row["run_wall_s"] = r.get("wall_s")
    row["stages"] = {s["name"]: {"status": s["status"], "wall_s": s.get("wall_s"),
                                 **{k: v for k, v in s.get("metrics", {}).items()
                                    if k in ("tokens_per_s", "train_wall_s", "eval_wall_s",
                                             "first_loss", "final_loss", "accuracy")}}
                     for s in r["stages"]}
# The worker's own description of its device ("cpu, N threads, fp32"), per stage.
threads = {}
for log in pathlib.Path(run).rglob("*.log"):
    m = re.search(r"cpu, (\d+) threads?", log.read_text(errors="replace"))
    if m:
        threads[log.parent.name + "/" + log.name] = int(m.group(1))
row["worker_threads_seen"] = threads
print(json.dumps(row))
PY
    tail -n 1 "$OUT/runs.jsonl" | cut -c1-300 >&2
}
n=${#arms[@]}
for ((rep = 1; rep <= REPS; rep++)); do
    for ((k = 0; k < n; k++)); do
        one_run "${arms[$(((k + rep - 1) % n))]}" "$rep"
    done
done
for ((rep = 1; rep <= REPS; rep++)); do
    for arm in "${extra[@]}"; do
        one_run "$arm" "$rep"
    done
done

python3 - "$OUT/runs.jsonl" "$OUT/summary.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def stat(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"n": len(xs), "median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3), "all": [round(x, 3) for x in xs]}
summary = {}
for arm in dict.fromkeys(r["arm"] for r in rows):
    rs = [r for r in rows if r["arm"] == arm]
    st = lambda name, key: stat([r.get("stages", {}).get(name, {}).get(key) for r in rs])
    summary[arm] = {
        "runs": len(rs), "failed": sum(r["rc"] != 0 for r in rs),
        "run_wall_s": stat([r.get("run_wall_s") for r in rs]),
        "pretrain_tokens_per_s": st("pretrain", "tokens_per_s"),
        "pretrain_train_wall_s": st("pretrain", "train_wall_s"),
        "sft_tokens_per_s": st("sft", "tokens_per_s"),
        "sft_train_wall_s": st("sft", "train_wall_s"),
        "eval_accuracy": st("eval", "accuracy"),
    }
json.dump(summary, open(sys.argv[2], "w"), indent=1)
print(json.dumps(summary, indent=1))
PY
