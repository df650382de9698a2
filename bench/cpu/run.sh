#!/usr/bin/env bash
# The quickstart on this machine's CPU, plus an SFT stage trained from scratch for comparison:
# the figures that show the pipeline is real (SFT starts from pretrain's weights; eval after SFT
# beats eval of the pretrain checkpoint). Writes bench/cpu/results-<date>.json.
#   bench/cpu/run.sh        (release binaries expected; builds them if absent)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x target/release/orchestrate ] && [ -x target/release/stage-worker ] || cargo build --release --locked --bins
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cp configs/quickstart.toml "$W/plan.toml"
cat >> "$W/plan.toml" <<'TOML'

[[stage]]
name = "sft-scratch"
kind = "train"
[stage.params]
data = "synthetic:sft"
steps = 200
batch_size = 64
lr = 3e-3
warmup_steps = 10
seed = 2
TOML
target/release/orchestrate --plan "$W/plan.toml" --run-dir "$W/run" -q
out=bench/cpu/results-$(date -u +%Y-%m-%d).json
python3 - "$W/run/report.json" "$out" <<'PY'
import json, os, platform, sys
r = json.load(open(sys.argv[1]))
st = {s["name"]: s for s in r["stages"]}
m = lambda n, k: st[n]["metrics"].get(k)
res = {
    "date": os.popen("date -u +%Y-%m-%dT%H:%M:%SZ").read().strip(),
    "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU",
    "run_wall_s": r["wall_s"],
    "stages": {n: {"status": s["status"], "wall_s": s["wall_s"], "metrics": s["metrics"]} for n, s in st.items()},
    "sft_first_loss_from_pretrain": m("sft", "first_loss"),
    "sft_first_loss_from_scratch": m("sft-scratch", "first_loss"),
    "sft_task_accuracy_after_sft": m("eval", "accuracy"),
    "sft_task_accuracy_pretrain_only": m("eval-pretrain", "accuracy"),
}
json.dump(res, open(sys.argv[2], "w"), indent=1)
print(json.dumps({k: v for k, v in res.items() if k != "stages"}, indent=1))
PY
