#!/usr/bin/env bash
# Orchestration overhead: N no-op command stages through `orchestrate` (journal on, each
# stage after the previous one) against Python peers doing N no-op child processes one after
# another; and orchestrate's peak RSS over 1,000 and 10,000-stage plans.
#   bench/overhead/run.sh [N] [RAY_N]      (release build of orchestrate expected)
# Writes bench/overhead/results-<date>.json and prints a table. Ray, when wanted, is installed
# into bench/overhead/.venv by this script.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-1000}; RAY_N=${2:-200}
BIN=target/release/orchestrate
[ -x "$BIN" ] || cargo build --release --locked -p orchestrator
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
venv=bench/overhead/.venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet ray==2.60.0
fi
plan() { # plan N FILE: N chained no-op stages
  python3 - "$1" "$2" <<'PY'
import sys
n, path = int(sys.argv[1]), sys.argv[2]
with open(path, "w") as f:
    f.write('[run]\nname = "noop"\n')
    for i in range(n):
        f.write(f'[[stage]]\nname = "s{i}"\ncommand = ["true"]\n')
        if i:
            f.write(f'after = ["s{i-1}"]\n')
PY
}
measure() { # measure N → "seconds peak_rss_kib"
  plan "$1" "$W/plan-$1.toml"
  python3 - "$BIN" "$W/plan-$1.toml" "$W/run-$1" <<'PY'
import os, subprocess, sys, time
t = time.perf_counter()
p = subprocess.Popen([sys.argv[1], "--plan", sys.argv[2], "--run-dir", sys.argv[3], "-q"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
_, status, usage = os.wait4(p.pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print(time.perf_counter() - t, usage.ru_maxrss)
PY
}
read -r t1 rss1 < <(measure "$N")
read -r t10 rss10 < <(measure $((N * 10)))
peers=$("$venv/bin/python" bench/overhead/peers.py "$N" "$RAY_N")
date=$(date -u +%Y-%m-%d)
out=bench/overhead/results-$date.json
python3 - "$N" "$t1" "$rss1" "$t10" "$rss10" "$peers" "$out" <<'PY'
import json, os, platform, sys
n, t1, rss1, t10, rss10, peers, out = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6]), sys.argv[7]
rate = n / t1
res = {
    "date": os.popen("date -u +%Y-%m-%dT%H:%M:%SZ").read().strip(),
    "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
    "stages": n,
    "orchestrate_stages_per_s": rate,
    "orchestrate_stages_per_s_10x": 10 * n / t10,
    "orchestrate_peak_rss_kib": {str(n): rss1, str(10 * n): rss10},
    "peers_stages_per_s": peers,
    "ratios_orchestrate_over_peer": {k: (rate / v if v else None) for k, v in peers.items()},
}
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
