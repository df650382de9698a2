#!/usr/bin/env bash
# GPU sharing (`gpu_memory`, issue 47) on one GPU, with release binaries from $BIN_DIR:
#   1. rate: 40 tiny GPU stages (bench/sharing/tiny.py: a CUDA tensor, a sum, a file) through
#      the zygote, one per GPU (`gpus = 1`) against four per GPU (`gpu_memory = "8GiB"`,
#      max_parallel = 4), alternating, REPS times each (default 2). Goal: sharing at >= 3x the
#      rate of one per GPU, every verdict clean.
#   1b. the same through a daemon whose zygotes a first run of each mode warmed (WARM=0 skips
#      it): the rate of the stages themselves, without each run's interpreter start. COLD=0
#      skips the CLI runs of 1 and keeps 1b.
#   1c. four per GPU as clients of an MPS daemon that orchestrate starts (`gpu_sharing = "mps"`),
#      alternating with the two above (MODES, default "whole shared mps"; "whole1" adds one
#      per GPU with CUDA_DEVICE_MAX_CONNECTIONS=1 in the plan, the one work queue that sharing
#      stages get from orchestrate: like for like).
#   2. leak: 4 stages share the GPU at once (a barrier); one leaves a process in a new session
#      holding 1 GiB. Goal: that one `leaked`, the other three `clean`, the run "succeeded with
#      leaked GPU memory" (exit 3). Plainly, then through MPS (with "mps" in MODES).
# Usage: BIN_DIR=/path/to/release OUT=/path/to/out bench/sharing/gpu.sh
# Writes everything under $OUT (runs, consoles, summary.txt) and prints the summary.
set -uo pipefail
: "${BIN_DIR:?set BIN_DIR to the directory of the release orchestrate and stage-worker}"
bin=$(cd "$BIN_DIR" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/out}/sharing
reps=${REPS:-2}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))'):${LD_LIBRARY_PATH:-}"
{ date -u; cat "$bin/COMMIT" 2>/dev/null
  nvidia-smi --query-gpu=index,uuid,name,driver_version,memory.used,memory.total --format=csv
  python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__)"
} > "$out/machine.txt" 2>&1

# The zygotes' logs (every standby's "standby ready" line) are kept with the results.
export ORCHESTRATE_ZYGOTE_CACHE="$out/zygote-cache"
modes=${MODES:-whole shared mps}
# How many stages of run directory DIR began as a zygote's standby.
standbys() {
  python3 -c 'import json, sys
r = json.load(open(sys.argv[1] + "/report.json"))
print(sum(1 for s in r["stages"] if (s.get("start") or {}).get("standby")), "of", len(r["stages"]))' "$1" 2> /dev/null
}
tiny_plan() { # MODE (whole|shared|mps) N
  echo "[run]"; echo "name = \"tiny-$1\""; echo 'preload = ["torch"]'; echo "max_parallel = 4"
  [ "$1" = mps ] && echo 'gpu_sharing = "mps"'
  for i in $(seq "$2"); do
    echo "[[stage]]"; echo "name = \"t$i\""
    case $1 in
      whole) echo "gpus = 1" ;;
      # one per GPU with the one work queue that sharing stages get (like for like)
      whole1) echo "gpus = 1"; echo 'env = { CUDA_DEVICE_MAX_CONNECTIONS = "1" }' ;;
      *) echo 'gpu_memory = "8GiB"' ;;
    esac
    echo "command = [\"python3\", \"$here/tiny.py\"]"; echo 'outputs = ["sum.txt"]'
  done
}
for mode in $modes; do tiny_plan "$mode" 40 > "$out/$mode.toml"; done
for r in $(seq "$reps"); do
  [ "${COLD:-1}" = 1 ] || break
  for mode in $modes; do
    quiet=-q; [ "$mode" = mps ] && quiet=  # its start lines say whether each stage ran through MPS
    timeout 300 "$bin/orchestrate" --plan "$out/$mode.toml" --run-dir "$out/run-$mode-$r" $quiet \
      > "$out/$mode-$r.console" 2>&1
    echo "$mode rep $r: exit $?" >> "$out/exits.txt"
    [ "$mode" = mps ] && echo "  started through MPS: $(grep -c 'through MPS' "$out/$mode-$r.console"), time-sliced: $(grep -c 'no MPS' "$out/$mode-$r.console")" >> "$out/exits.txt"
    echo "  began as a standby: $(standbys "$out/run-$mode-$r")" >> "$out/exits.txt"
  done
done

# 1b. The same through a daemon whose zygote is already warm (a first run imported torch in
#     it): a sweep submitted to a running daemon pays no interpreter start, so this is the
#     rate of the stages themselves. Each run directory is linked as warm-MODE-REP.
if [ "${WARM:-1}" = 1 ]; then
  sock="$out/daemon.sock"
  "$bin/orchestrate" daemon --socket "$sock" --runs-dir "$out/daemon-runs" > "$out/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.1; done
  submit() { # PLAN NAME
    local line dir
    line=$(timeout 300 "$bin/orchestrate" submit --socket "$sock" --wait --json "$1" | sed -n 1p)
    dir=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["run_dir"])' "$line")
    ln -sfn "$dir" "$out/$2"
  }
  # One warm-up run per mode: each mode's stages have a zygote of their own (an MPS stage's
  # environment names its daemon's directory), which the warm-up starts.
  for mode in $modes; do
    tiny_plan "$mode" 4 > "$out/warm-up-$mode.toml"
    submit "$out/warm-up-$mode.toml" "warm-up-$mode"
  done
  for r in $(seq "$reps"); do
    for mode in $modes; do
      submit "$out/$mode.toml" "warm-$mode-$r"
      echo "warm $mode rep $r: done; began as a standby: $(standbys "$out/warm-$mode-$r")" >> "$out/exits.txt"
    done
  done
  "$bin/orchestrate" shutdown --socket "$sock" > /dev/null 2>&1
  wait "$daemon"
fi

# 2. Four stages sharing the GPU, one leaving a GPU-holding process behind: plainly, and
#    through MPS.
leak_plan() { # SHARING
  echo "[run]"; echo 'name = "shared-leak"'; echo 'preload = ["torch"]'; echo "max_parallel = 4"
  echo 'on_leak = "warn"'; echo 'reclaim_timeout = "5s"'; echo "gpu_sharing = \"$1\""
  for i in 1 2 3 4; do
    extra=""; [ "$i" = 3 ] && extra=', "leak"'
    echo "[[stage]]"; echo "name = \"s$i\""; echo 'gpu_memory = "8GiB"'
    echo "command = [\"python3\", \"$here/tiny.py\", \"$out/barrier\", \"4\"$extra]"
  done
}
for sharing in time_slice mps; do
  [ "$sharing" = mps ] && ! echo "$modes" | grep -qw mps && continue
  name=leak; [ "$sharing" = mps ] && name=leak-mps
  leak_plan "$sharing" > "$out/$name.toml"
  rm -rf "$out/barrier"
  timeout 300 "$bin/orchestrate" --plan "$out/$name.toml" --run-dir "$out/run-$name" > "$out/$name.console" 2>&1
  echo "$name: exit $?" >> "$out/exits.txt"
  # The leaked child is still there (its stage's verdict named it); it goes before the next.
  pkill -f "run-$name/.*child-ready" 2> /dev/null; sleep 1
done
nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$out/nvml-after.txt" 2>&1

python3 - "$out" "$reps" <<'PY' | tee "$out/summary.txt"
import json, os, sys
out, reps = sys.argv[1], int(sys.argv[2])
def report(d):
    with open(os.path.join(out, d, "report.json")) as f:
        return json.load(f)
def verdicts(r):
    return [g["verdict"] for s in r["stages"] for g in s.get("gpu", [])]
def rates_of(prefix, label):
    rates = {}
    for mode in ("whole", "whole1", "shared", "mps"):
        for rep in range(1, reps + 1):
            if not os.path.exists(os.path.join(out, f"{prefix}-{mode}-{rep}")):
                continue
            try:
                r = report(f"{prefix}-{mode}-{rep}")
            except OSError as e:
                print(f"{label} {mode} rep {rep}: no report ({e})"); continue
            v = verdicts(r)
            ok = sum(s["status"] == "succeeded" for s in r["stages"])
            rate = len(r["stages"]) / r["wall_s"]
            rates.setdefault(mode, []).append(rate)
            print(f"{label} {mode} rep {rep}: {r['status']}, {ok}/{len(r['stages'])} succeeded, "
                  f"{r['wall_s']:.1f} s, {rate:.2f} stages/s, verdicts: "
                  f"{ {x: v.count(x) for x in sorted(set(v))} }")
            # A verdict other than clean is printed whole: the run directories are too deep
            # to come back from a device call.
            for s in r["stages"]:
                for g in s.get("gpu", []):
                    if g["verdict"] != "clean":
                        print(f"  {s['name']}: {g['verdict']}, baseline {g['baseline_bytes'] >> 20} MiB, "
                              f"after {g['after_bytes'] >> 20} MiB, peak {g['peak_bytes'] >> 20} MiB, "
                              f"waited {g['reclaim_ms']:.0f} ms; holders {g.get('holders')}; "
                              f"note: {g.get('note')}")
    mean = lambda m: sum(rates[m]) / len(rates[m])
    for base, base_label in (("whole", "whole"), ("whole1", "whole with one work queue")):
        for m, m_label in (("shared", "shared"), ("mps", "shared through MPS")):
            if rates.get(base) and rates.get(m):
                print(f"{label} rate: {m_label} {mean(m):.2f}/s against {base_label} "
                      f"{mean(base):.2f}/s: {mean(m) / mean(base):.2f}x (goal >= 3x)")
rates_of("run", "cold (CLI, each run starts its zygote)")
if os.path.exists(os.path.join(out, "warm-whole-1")):
    rates_of("warm", "warm (daemon, zygote already imported)")
for leak in ("run-leak", "run-leak-mps"):
  try:
    r = report(leak)
    print(f"{leak}: {r['status']}")
    for s in r["stages"]:
        for g in s.get("gpu", []):
            print(f"  {s['name']}: {g['verdict']} baseline {g['baseline_bytes'] >> 20} MiB, "
                  f"after {g['after_bytes'] >> 20} MiB, peak {g['peak_bytes'] >> 20} MiB"
                  + (f" ({g['note']})" if g.get("note") else ""))
    want = {"s1": "clean", "s2": "clean", "s3": "leaked", "s4": "clean"}
    got = {s["name"]: (s.get("gpu") or [{}])[0].get("verdict") for s in r["stages"]}
    print("leak goal met" if got == want else f"leak goal NOT met: {got}")
  except OSError as e:
    print(f"{leak}: no report ({e})")
PY
cat "$out/exits.txt"
# (Only the runs that exist: WARM=0 makes no warm-* runs.)
python3 "$here/phases.py" $(ls -d "$out"/run-whole-* "$out"/run-whole1-* "$out"/run-shared-* "$out"/run-mps-* "$out"/warm-whole-* "$out"/warm-whole1-* "$out"/warm-shared-* "$out"/warm-mps-* 2> /dev/null) \
  > "$out/phases.txt" 2>&1
cat "$out/phases.txt"
