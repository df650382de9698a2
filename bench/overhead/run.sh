#!/usr/bin/env bash
# Orchestration overhead at sweep scale (see bench/overhead/README.md):
#   bench/overhead/run.sh [SIZES] [REPS] [RUN_BASE]   defaults: 1000:7,10000:5,100000, 3, the temp dir
#   (a size N:R runs R repetitions; the others run REPS)
# Builds the release binary if needed, then runs bench.py, which writes
# bench/overhead/results-<date>-<commit>[-<run base>][-<sizes, when given>].json and prints a
# summary. Needs about 17 GB of free disk for the 100,000-stage runs (their run directories are
# kept until the end: see the README).
set -euo pipefail
cd "$(dirname "$0")/../.."
SIZES=${1:-1000:7,10000:5,100000}; REPS=${2:-3}; RUN_BASE=${3:-}
BIN=target/release/orchestrate
cargo build --release --locked -p orchestrator
python3 bench/overhead/bench.py --bin "$BIN" --sizes "$SIZES" --reps "$REPS" \
  ${RUN_BASE:+--run-base "$RUN_BASE"} \
  --out "bench/overhead/results-$(date -u +%Y-%m-%d)-$(git rev-parse --short HEAD)${RUN_BASE:+-$(basename "$RUN_BASE")}${1:+-$(echo "$SIZES" | tr ',:' '_x')}.json"
