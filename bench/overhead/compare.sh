#!/usr/bin/env bash
# One command for an A/B of two orchestrate binaries against the subprocess.run loop, on tmpfs
# and on the disk (see bench/overhead/README.md, "Per-stage cost against an older binary"):
#   bench/overhead/compare.sh OLD_COMMIT [SIZES] [DISK_BASE] [SHM_BASE]
#   defaults: SIZES 1000:4,20000:3, DISK_BASE the system's temporary directory, SHM_BASE /dev/shm
#   (OLD_TREE, OLD_TARGET: an existing checkout and target directory of OLD_COMMIT to reuse)
# Builds this tree's release binary and OLD_COMMIT's (in a worktree of its own, once), copies
# both aside so that a rebuild during the run changes nothing, then runs bench.py with
# --baseline OLD --alternate on the chained plans (written out, and chained pairs) in each place:
# every orchestrate run bracketed by loop runs, the old binary first in every other repetition.
# Writes results-<date>-<commit>-vs-<old>-<shm|disk>-<sizes>.json here and prints summaries.
set -euo pipefail
cd "$(dirname "$0")/../.."
OLD=${1:?usage: compare.sh OLD_COMMIT [SIZES] [DISK_BASE] [SHM_BASE]}
SIZES=${2:-1000:4,20000:3}; DISK_BASE=${3:-${TMPDIR:-/tmp}}; SHM_BASE=${4:-/dev/shm}
OLD=$(git rev-parse --short "$OLD"); NEW=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || NEW="$NEW+uncommitted"
cargo build --release --locked -p orchestrator --bin orchestrate
# OLD_TREE / OLD_TARGET: where OLD_COMMIT is checked out and built (an existing build is reused).
OLD_TREE=${OLD_TREE:-${TMPDIR:-/tmp}/orchestrate-$OLD}; OLD_TARGET=${OLD_TARGET:-$OLD_TREE/target}
[ -d "$OLD_TREE" ] || git worktree add --detach "$OLD_TREE" "$OLD"
(cd "$OLD_TREE" && CARGO_TARGET_DIR="$OLD_TARGET" cargo build --release --locked -p orchestrator --bin orchestrate)
BINS=target/bench-bins; mkdir -p "$BINS"
cp target/release/orchestrate "$BINS/orchestrate-new"
cp "$OLD_TARGET/release/orchestrate" "$BINS/orchestrate-$OLD"
for place in shm disk; do
  base=$SHM_BASE; [ "$place" = disk ] && base=$DISK_BASE
  BENCH_COMMIT=$NEW python3 bench/overhead/bench.py --bin "$BINS/orchestrate-new" \
    --baseline "$BINS/orchestrate-$OLD" --alternate --plans chain-explicit,chain \
    --sizes "$SIZES" --run-base "$base" \
    --out "bench/overhead/results-$(date -u +%Y-%m-%d)-$NEW-vs-$OLD-$place-$(echo "$SIZES" | tr ',:' '_x').json"
done
