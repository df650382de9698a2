#!/usr/bin/env bash
# Does any CUDA setting make a context cheaper, or contexts made at once queue less? (issue 47:
# four tiny stages sharing a GPU wait for their contexts one after another.)
# context_probe.py at widths 1 and 4 under each setting below, plainly and as clients of a
# private MPS daemon, the settings alternated within each mode:
#   bench/sharing/context_env.sh OUT_DIR [WAVES]
# Writes OUT_DIR/env-<mode>-<n>.json (one per setting, its settings inside) and prints a table.
set -uo pipefail
out=$(mkdir -p "$1" && cd "$1" && pwd)
waves=${2:-4}
here=$(cd "$(dirname "$0")" && pwd)
settings=(
  ""
  "CUDA_DEVICE_MAX_CONNECTIONS=1"
  "CUDA_MODULE_LOADING=EAGER"
  "PROBE=raw"
  "PROBE=raw CUDA_DEVICE_MAX_CONNECTIONS=1"
)
probe() { # MODE
  local i=0
  for s in "${settings[@]}" ${CUDA_MPS_PIPE_DIRECTORY:+"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25"}; do
    i=$((i + 1))
    env WIDTHS="1 4" $s timeout 120 python3 "$here/context_probe.py" "$waves" \
      > "$out/env-$1-$i.json" 2> "$out/env-$1-$i.err"
    echo "$1 [$s]: exit $?"
  done
}
probe plain
if command -v nvidia-cuda-mps-control > /dev/null; then
  mps=$(mktemp -d)
  export CUDA_MPS_PIPE_DIRECTORY=$mps/pipe CUDA_MPS_LOG_DIRECTORY=$mps/log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d
  probe mps
  echo quit | nvidia-cuda-mps-control
  sleep 1
  rm -rf "$mps"
fi
python3 - "$out" <<'PY' | tee "$out/summary.txt"
import glob, json, sys
print("mode | settings | width | init ms | context ms | child ms | stages/s (median)")
for f in sorted(glob.glob(sys.argv[1] + "/env-*.json")):
    try:
        d = json.load(open(f))
    except Exception as e:
        print(f, "unreadable:", e)
        continue
    env = " ".join(f"{k}={v}" for k, v in sorted(d["env"].items()) if "DIRECTORY" not in k) or "-"
    for w, v in d["widths"].items():
        print(f"{'mps' if d['mps'] else 'plain'} | {env} | {w} | {v['init_ms']['median']:.0f} | "
              f"{v['context_ms']['median']:.0f} | {v['child_ms']['median']:.0f} | "
              f"{v['stages_per_s']['median']:.2f}")
PY
