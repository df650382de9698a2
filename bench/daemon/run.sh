#!/usr/bin/env bash
# The daemon benchmark on this machine: builds the release binary, runs bench.py (3 fresh
# daemons × 1,000 no-op runs each, plus an event-delay run) and writes
# bench/daemon/results-<date>.json with the machine and commit.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --locked -p orchestrator --bin orchestrate
work=$(mktemp -d)
out="bench/daemon/results-$(date -u +%Y-%m-%d).json"
python3 bench/daemon/bench.py target/release/orchestrate "$work" "${RUNS:-1000}" "${REPEATS:-3}" > "$work/summary.json"
python3 - "$work/summary.json" "$out" <<'PY'
import json, os, subprocess, sys, platform
s = json.load(open(sys.argv[1]))
s["machine"] = {"cpus": os.cpu_count(), "kernel": platform.release(),
                "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")}
s["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
s["date"] = subprocess.run(["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"], capture_output=True, text=True).stdout.strip()
json.dump(s, open(sys.argv[2], "w"), indent=1)
print(json.dumps({k: s[k] for k in ("submits_per_s", "runs_finished_per_s", "event_delay_ms", "rss_after_runs_mib")}, indent=1))
PY
rm -rf "$work"
