#!/usr/bin/env bash
# On the GPU host, quickly: is DeepSpeed preloaded (NVML held back while the zygote imports),
# and does a Python stage with GPUs begin as a standby? Three chained
# one-GPU stages of first_line.py with preload = torch, transformers' Llama and DeepSpeed,
# from an empty zygote cache; prints each stage's `start` and keeps the zygote's log (its
# standbys' lines) and the console (why a stage did not adopt one). Results in $OUT/standby.
#   bench/zygote/standby_check.sh BIN_DIR   (DeepSpeed's wheels in .whl/)
set -uo pipefail
bin=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/../.." && pwd)
r=${OUT:-/tmp/out}/standby
mkdir -p "$r"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "$repo"/.whl/*.whl > /dev/null 2>&1
export PYTHONPATH="$repo/python:/tmp/site"
export LD_LIBRARY_PATH="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))'):${LD_LIBRARY_PATH:-}"
{
  echo "[run]"
  echo 'preload = ["torch", "transformers", "transformers.models.llama.modeling_llama", "deepspeed"]'
  prev=
  for i in 1 2 3; do
    echo "[[stage]]"; echo "name = \"s$i\""; echo "gpus = 1"
    [ -n "$prev" ] && echo "after = [\"$prev\"]"
    echo "command = [\"python3\", \"$repo/bench/zygote/first_line.py\"]"; prev=s$i
  done
} > "$r/plan.toml"
ORCHESTRATE_ZYGOTE_CACHE=$r/cache \
  RUST_LOG=orchestrator::process::fork_server::standby=debug,orchestrator::process::zygote=debug \
  timeout "${LIMIT:-90}" "$bin/orchestrate" --plan "$r/plan.toml" --run-dir "$r/run" > "$r/console.txt" 2>&1
echo "exit $?"
python3 - "$r/run/report.json" <<'PY'
import json, sys
for s in json.load(open(sys.argv[1]))["stages"]:
    print(s["name"], s["status"], json.dumps(s.get("start"))[:300])
PY
cp "$r/run/report.json" "$r/report.json" 2>/dev/null
grep -i "standby" "$r/console.txt" | tail -20
grep -ih "standby\|context" "$r"/cache/*.log 2>/dev/null | tail -20
# What each zygote imported, left out and why (DeepSpeed should not be among those left out).
grep -h "ready:\|restarting\|leaving out\|refused" "$r"/cache/*.log 2>/dev/null | tail -20
