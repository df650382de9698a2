#!/usr/bin/env bash
# Where a run's start goes on a GPU host (issue 44 item 7: on the H100 host the first no-op
# stage started 15-25 ms later than with a885c33's binary, on the 2-core machine without a
# driver 1-3 ms). A one-stage plan (`true`) on /dev/shm, each binary RUNS times alternated:
# the wall and the first stage's start (from the journal); then, where strace is installed, one run of
# each under `strace -f -tt -T`.
# SIZES (default "1 100 1000"): chains of that many stages, to see whether a difference grows
# with the plan.
#   BIN_DIR=DIR OLD=a885c33 OUT=DIR bench/overhead/start_trace.sh
# BIN_DIR holds orchestrate-new and orchestrate-$OLD.
set -uo pipefail
: "${BIN_DIR:?}" "${OUT:?}" "${OLD:?}"
runs=${RUNS:-10}
work=$(mktemp -d /dev/shm/start-trace.XXXXXX)
printf '[run]\nname = "one"\n[[stage]]\nname = "a"\ncommand = ["true"]\n' > "$work/one.toml"
for n in ${SIZES:-1 100 1000}; do
python3 - "$BIN_DIR" "$OLD" "$work" "$runs" "$n" <<'PY' | tee -a "$OUT/start-times.txt"
import json, os, statistics, subprocess, sys, time
bin_dir, old, work, runs, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
with open(f"{work}/one.toml", "w") as f:
    f.write('[run]\nname = "chain"\n')
    for i in range(n):
        f.write(f'[[stage]]\nname = "s{i}"\ncommand = ["true"]\n' + (f'after = ["s{i - 1}"]\n' if i else ""))
bins = {"new": f"{bin_dir}/orchestrate-new", old: f"{bin_dir}/orchestrate-{old}"}
walls = {k: [] for k in bins}
firsts = {k: [] for k in bins}
for i in range(runs):
    for k, b in (bins.items() if i % 2 == 0 else reversed(list(bins.items()))):
        run = f"{work}/run-{k}-{n}-{i}"
        t0 = time.time()
        subprocess.run([b, "--plan", f"{work}/one.toml", "--run-dir", run, "-q"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        walls[k].append((time.time() - t0) * 1e3)
        for line in open(f"{run}/journal.jsonl"):
            r = json.loads(line)
            if r.get("rec") == "stage_started":
                firsts[k].append(r["t"] - t0 * 1e3)
                break
for k in bins:
    w = walls[k]
    print(f"{n} stages, {k}: wall median {statistics.median(w):.1f} ms ({min(w):.1f}-{max(w):.1f}), n={len(w)}"
          + (f"; first stage {statistics.median(firsts[k]):.1f} ms" if firsts[k] else ""))
PY
rm -rf "$work"/run-*
done
for k in new "$OLD"; do
  if command -v strace > /dev/null; then
    strace -f -tt -T -o "$OUT/strace-$k.txt" "$BIN_DIR/orchestrate-$k" --plan "$work/one.toml" \
      --run-dir "$work/strace-$k" -q > /dev/null 2>&1
  fi
done
command -v strace > /dev/null || echo "no strace on this host" >> "$OUT/start-times.txt"
rm -rf "$work"
