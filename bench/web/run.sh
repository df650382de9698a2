#!/usr/bin/env bash
# The web view's cost benchmark on this machine: builds the release binary, runs bench.py
# (a 10,000-stage sweep with no page open and with 50 pages open, alternating, 3 trials each)
# and writes bench/web/results-<date>-<commit>.json with the machine and commit.
set -euo pipefail
cd "$(dirname "$0")/../.."
# BIN=path uses that binary instead of building one (say which commit it was built from).
bin=${BIN:-target/release/orchestrate}
[[ -n ${BIN:-} ]] || cargo build --release --locked -p orchestrator --bin orchestrate
work=$(mktemp -d)
commit=$(git rev-parse --short HEAD)
out="bench/web/results-$(date -u +%Y-%m-%d)-$commit.json"
python3 bench/web/bench.py "$bin" "$work" "${STAGES:-10000}" "${PAGES:-50}" "${TRIALS:-3}" > "$work/summary.json"
python3 - "$work/summary.json" "$out" <<'PY'
import json, os, subprocess, sys, platform
s = json.load(open(sys.argv[1]))
s["machine"] = {"cpus": os.cpu_count(), "kernel": platform.release(),
                "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")}
s["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
s["binary_built_from"] = os.environ.get("BIN_COMMIT", s["commit"])
s["date"] = subprocess.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True).stdout.strip()
json.dump(s, open(sys.argv[2], "w"), indent=1)
print(json.dumps({k: s[k] for k in ("cpu_ratio", "rate_ratio", "no_page", "pages_open", "every_page_read_every_stage_end_and_the_run_end")}, indent=1))
PY
rm -rf "$work"
