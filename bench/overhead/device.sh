#!/usr/bin/env bash
# The per-stage cost A/B (issue 44 item 7) on a quiet machine: the lent GPU host's CPUs, which
# no one else's builds share (the development machine's two cores are shared, so its figures
# compare little). Runs bench.py with --baseline --alternate on tmpfs and on the disk (1,000
# chained stages written out and as matrix pairs, 4 repetitions; 20,000 as matrix pairs, 3),
# then the new binary without per-stage cgroups (ORCHESTRATE_CGROUPS=0) against the same old
# binary, and cgroup_spawn.c where a C compiler is found, to say what the cgroups cost.
#   BIN_DIR=DIR OLD=a885c33 NEW=<commit> bench/overhead/device.sh
# (PLACES=shm or PLACES=disk runs one of the two, for a call with less time.)
# BIN_DIR holds orchestrate-new and orchestrate-$OLD (release builds, stripped to be carried);
# results go to $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${BIN_DIR:?}" "${OUT:?}" "${OLD:?}" "${NEW:?}"
SIZES=${SIZES:-1000:4,20000:3}
DISK_BASE=${DISK_BASE:-/var/tmp}
new="$BIN_DIR/orchestrate-new"; old="$BIN_DIR/orchestrate-$OLD"
day=$(date -u +%Y-%m-%d)
tag=$(echo "$SIZES" | tr ',:' '_x')
{ nproc; uname -r; grep -m1 'model name' /proc/cpuinfo; df -hT /dev/shm "$DISK_BASE"; mount | grep cgroup; } > "$OUT/machine.txt" 2>&1
for place in ${PLACES:-shm disk}; do
  base=/dev/shm; [ "$place" = disk ] && base=$DISK_BASE
  BENCH_COMMIT=$NEW python3 bench/overhead/bench.py --bin "$new" --baseline "$old" --alternate \
    --plans chain-explicit,chain --sizes "$SIZES" --run-base "$base" \
    --out "$OUT/results-$day-$NEW-vs-$OLD-h200host-$place-$tag.json" 2> "$OUT/log-$place.txt"
  tail -n 3 "$OUT/log-$place.txt"
done
ORCHESTRATE_CGROUPS=0 BENCH_COMMIT="$NEW-nocgroups" python3 bench/overhead/bench.py --bin "$new" \
  --baseline "$old" --alternate --plans chain-explicit --sizes 1000:4 --run-base /dev/shm \
  --out "$OUT/results-$day-$NEW-nocgroups-vs-$OLD-h200host-shm-1000x4.json" 2> "$OUT/log-nocgroups.txt"
if command -v cc > /dev/null; then
  cc -O2 -o "$OUT/cgroup_spawn" bench/overhead/cgroup_spawn.c \
    && "$OUT/cgroup_spawn" "/sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)" 1000 9 \
      > "$OUT/cgroup-spawn-$day-h200host.json" 2> "$OUT/log-cgroup-spawn.txt" \
    && cat "$OUT/cgroup-spawn-$day-h200host.json" || echo "cgroup_spawn: see log-cgroup-spawn.txt"
  rm -f "$OUT/cgroup_spawn"
fi
python3 - "$OUT" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/results-*.json")):
    r = json.load(open(f))
    for n, size in r["sizes"].items():
        for plan, s in size["summary"].items():
            if isinstance(s, dict) and "stages_per_s" in s:
                nb = s.get("new_over_baseline", {}).get("median")
                print(f.split("/")[-1], n, plan, "rate", round(s["stages_per_s"]["median"]),
                      "ratio_loop", round(s["ratio_to_subprocess_run_loop"]["median"], 3),
                      "new/old", None if nb is None else round(nb, 3))
PY
