#!/usr/bin/env bash
# How an MPS daemon that orchestrate started ends, on a real GPU with NVIDIA's own
# `nvidia-cuda-mps-control`: two release binaries, $NEW_DIR/orchestrate and $OLD_DIR/orchestrate,
# alternated REPS times (default 3) on each of two plans of four sharing stages
# (`gpu_sharing = "mps"`, bench/sharing/tiny.py with a barrier, so that they overlap):
#   quit:  the run as it comes: the daemon is told to `quit` after the last stage's verdict.
#          Measured: the run's wall time, the daemon's and server's session and process group
#          while the stages run, any "did not end" line (the kill after 5 s), and what of MPS
#          is left on the machine after the run.
#   crash: the control daemon is killed (SIGKILL) once the server runs, while the stages wait
#          at their barrier. Measured: what of MPS is left after the run (its server, left
#          running by a binary that does not kill what a dead daemon left).
# Usage: NEW_DIR=... OLD_DIR=... OUT=... bench/sharing/mps_stop.sh
# Writes $OUT/mps-stop/summary.txt and consoles.tar.gz (every run's console) and prints the
# summary.
set -uo pipefail
: "${NEW_DIR:?the directory of the new release orchestrate}" "${OLD_DIR:?the old one}"
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${OUT:-/tmp/out}/mps-stop
mkdir -p "$out"
reps=${REPS:-3}
export PYTHONPATH="$repo/python${PYTHONPATH:+:$PYTHONPATH}"
export LD_LIBRARY_PATH="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))'):${LD_LIBRARY_PATH:-}"
summary=$out/summary.txt
runs=/tmp/mps-stop
rm -rf "$runs"
{ date -u; nvidia-smi --query-gpu=index,uuid,name,driver_version --format=csv,noheader
  command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control"
  for b in "$NEW_DIR" "$OLD_DIR"; do echo "$b: $(cat "$b/COMMIT" 2>/dev/null)"; done
} > "$summary" 2>&1

plan() { # NAME BARRIER
  echo "[run]"; echo "name = \"$1\""; echo "max_parallel = 4"; echo 'gpu_sharing = "mps"'
  for i in 1 2 3 4; do
    echo "[[stage]]"; echo "name = \"t$i\""; echo 'gpu_memory = "8GiB"'
    echo "command = [\"python3\", \"$here/tiny.py\", \"$2\", \"4\"]"; echo 'outputs = ["sum.txt"]'
  done
}

# The MPS processes on the machine, one line each: pid, session, group, parent, command
# (their names are cut to 15 characters, "nvidia-cuda-mps", so the command line tells them apart).
mps_processes() {
  ps -eo pid=,sid=,pgid=,ppid=,args= | awk '$5 ~ /nvidia-cuda-mps-(control|server)/'
}

one_run() { # WHICH(new|old) BIN MODE REP
  local which=$1 bin=$2 mode=$3 rep=$4
  local tag=$mode-$which-$rep dir=$runs/$mode-$which-$rep
  rm -rf "$dir"; mkdir -p "$dir/barrier"
  plan "$tag" "$dir/barrier" > "$dir/plan.toml"
  local start end rc
  start=$(date +%s.%N)
  timeout 300 "$bin/orchestrate" --plan "$dir/plan.toml" --run-dir "$dir/run" > "$dir/console" 2>&1 &
  local pid=$!
  # While the stages run: who the daemon and its server are (and, for crash, kill the daemon).
  local seen=""
  for _ in $(seq 200); do
    seen=$(mps_processes)
    echo "$seen" | grep -q nvidia-cuda-mps-server && break
    sleep 0.05
  done
  echo "during: ${seen//$'\n'/ | }" >> "$dir/ps"
  if [ "$mode" = crash ]; then
    pkill -KILL -f 'nvidia-cuda-mps-control' && echo "killed the control daemon" >> "$dir/ps"
  fi
  wait "$pid"; rc=$?
  end=$(date +%s.%N)
  sleep 0.5
  local left
  left=$(mps_processes)
  printf '%s %s rep %s: exit %s, wall %.2f s, killed-after-5s lines %s, left after: %s\n' \
    "$mode" "$which" "$rep" "$rc" "$(awk "BEGIN { print $end - $start }")" \
    "$(grep -c 'did not end\|did not quit' "$dir/console")" "${left:-nothing}" >> "$summary"
  cat "$dir/ps" >> "$summary"
  grep 'MPS daemon\|MPS server' "$dir/console" | head -5 | sed 's/^/  console: /' >> "$summary"
  # Whatever a run left is cleared, so that the next starts as the first did.
  pkill -KILL -f nvidia-cuda-mps 2>/dev/null; sleep 0.2
}

for mode in quit crash; do
  for rep in $(seq "$reps"); do
    one_run new "$NEW_DIR" "$mode" "$rep"
    one_run old "$OLD_DIR" "$mode" "$rep"
  done
done
(cd "$runs" && tar -czf "$out/consoles.tar.gz" ./*/console ./*/ps)
cat "$summary"
