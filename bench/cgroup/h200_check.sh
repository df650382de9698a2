#!/usr/bin/env bash
# Per-stage cgroup v2 checks on a host that delegates cgroup v2 (the GPU machine: root, no
# systemd, `cpuset cpu io memory hugetlb pids` in cgroup.subtree_control):
#   1. a stage allocating past `memory = "256MiB"` ends `oom_killed` with its peak and limit in
#      report.json, while a sibling stage and the orchestrator survive;
#   2. a fork bomb held by `pids = 64` (pids.events max > 0), reaped to zero processes within
#      1 s of its main process's exit (grace 0s: cgroup.kill at once);
#   3. a double-forked escapee (own session, empty environment) found through the cgroup's
#      membership and killed with it; the run's cgroup removed afterwards;
#   4. the 1,000-stage overhead benchmark (bench/overhead/bench.py) with cgroups against the
#      same binary with ORCHESTRATE_CGROUPS=0, same run, alternating.
# Usage: bench/cgroup/h200_check.sh BIN OUTDIR   (BIN: a release orchestrate)
# Writes OUTDIR/summary.json (one verdict per check) and each check's console and report.
set -uo pipefail
BIN=$(realpath "$1"); OUT=$(realpath -m "$2"); mkdir -p "$OUT"
HERE=${REPO:-$(cd "$(dirname "$0")/../.." && pwd)}   # the checkout holding bench/overhead
W=$(mktemp -d /tmp/cgcheck.XXXXXX)
own=/sys/fs/cgroup$(sed -n "s/^0:://p" /proc/self/cgroup)
{
  date -u +%FT%TZ; uname -a; nvidia-smi --query-gpu=name,uuid --format=csv,noheader 2>&1
  echo "own cgroup: $own"
  echo "own cgroup.controllers: $(cat "$own/cgroup.controllers" 2>&1)"
  echo "own cgroup.subtree_control: $(cat "$own/cgroup.subtree_control" 2>&1)"
  echo "own cgroup.procs: $(wc -l < "$own/cgroup.procs") process(es)"
  echo "root cgroup.subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control 2>&1)"
  echo "doctor (own cgroup): $("$BIN" doctor)"
} > "$OUT/host.txt" 2>&1
# A cgroup holding processes gives its children no controller (cgroup v2's rule, the root
# aside): where this one does not delegate memory, a delegated subtree is made for the check
# at the root of the hierarchy (as an administrator delegates one to a service), named to
# orchestrate by ORCHESTRATE_CGROUP_PARENT, and removed at the end.
PARENT=
if ! "$BIN" doctor | grep -q "memory: yes"; then
  PARENT=/sys/fs/cgroup/orchestrate-check-$$
  mkdir "$PARENT" && echo "+memory +pids +cpu" > "$PARENT/cgroup.subtree_control"
  export ORCHESTRATE_CGROUP_PARENT=$PARENT
  echo "delegated subtree for the check: $PARENT ($(cat "$PARENT/cgroup.subtree_control"))" >> "$OUT/host.txt"
  echo "doctor (with it): $("$BIN" doctor)" >> "$OUT/host.txt"
fi
cat "$OUT/host.txt"

# 1. memory
cat > "$W/hog.py" <<'PY'
import time
held = []
while True:
    held.append(b"x" * (16 << 20))  # written, so resident
    time.sleep(0.005)
PY
cat > "$W/oom.toml" <<TOML
[run]
name = "oom"
[[stage]]
name = "hog"
memory = "256MiB"
command = ["python3", "$W/hog.py"]
[[stage]]
name = "sibling"
command = ["sh", "-c", "sleep 3; echo sibling-done"]
TOML
"$BIN" --plan "$W/oom.toml" --run-dir "$W/oom" > "$OUT/oom.console" 2>&1; echo "exit $?" >> "$OUT/oom.console"
cp "$W/oom/report.json" "$OUT/oom.report.json" 2>/dev/null

# 2. fork bomb
cat > "$W/bomb.py" <<'PY'
import os, time
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.001)
PY
cat > "$W/bomb.toml" <<TOML
[run]
name = "bomb"
grace = "0s"
[[stage]]
name = "bomb"
pids = 64
command = ["sh", "-c", "python3 $W/bomb.py forkbomb-$$ & sleep 2; exit 0"]
TOML
"$BIN" --plan "$W/bomb.toml" --run-dir "$W/bomb" > "$OUT/bomb.console" 2>&1; echo "exit $?" >> "$OUT/bomb.console"
echo "left: $(pgrep -fc "forkbomb-$$")" >> "$OUT/bomb.console"
cp "$W/bomb/report.json" "$OUT/bomb.report.json" 2>/dev/null

# 3. escapee
cat > "$W/escape.toml" <<TOML
[[stage]]
name = "escape"
command = ["sh", "-c", "setsid env -i /bin/sh -c 'sleep 600; : escapee-$$' </dev/null >/dev/null 2>&1 & sleep 0.5"]
TOML
"$BIN" --plan "$W/escape.toml" --run-dir "$W/escape" > "$OUT/escape.console" 2>&1; echo "exit $?" >> "$OUT/escape.console"
sleep 0.2
echo "left: $(pgrep -fc "escapee-$$")" >> "$OUT/escape.console"
echo "run cgroups left: $(ls -d "${PARENT:-$own}"/orchestrate-* 2>/dev/null | wc -l)" >> "$OUT/escape.console"
cp "$W/escape/report.json" "$OUT/escape.report.json" 2>/dev/null

# 4. overhead, with and without cgroups
printf '#!/bin/sh\nORCHESTRATE_CGROUPS=0 exec %s "$@"\n' "$BIN" > "$W/nocgroups"; chmod +x "$W/nocgroups"
python3 "$HERE/bench/overhead/bench.py" --bin "$BIN" --baseline "$W/nocgroups" --alternate \
  --sizes "${SIZES:-1000:5}" --plans independent,chain --run-base "$W" --out "$OUT/overhead.json" \
  > "$OUT/overhead.log" 2>&1

# 5. the delegated subtree goes (orchestrate removed every cgroup it made under it).
if [ -n "$PARENT" ]; then
  echo "subtree left: $(find "$PARENT" -mindepth 1 -type d | wc -l) cgroup(s)" >> "$OUT/host.txt"
  rmdir "$PARENT" && echo "subtree removed" >> "$OUT/host.txt"
fi

python3 - "$OUT" <<'PY'
import json, re, sys
out = sys.argv[1]
def load(name):
    try:
        return json.load(open(f"{out}/{name}"))
    except Exception as e:
        return {"error": str(e)}
def stage(report, name):
    return next((s for s in report.get("stages", []) if s["name"] == name), {})
def console(name):
    return open(f"{out}/{name}.console").read()
s = {}
r = load("oom.report.json"); hog, sib = stage(r, "hog"), stage(r, "sibling")
h = hog.get("host") or {}
s["oom"] = {
    "hog_failure": hog.get("failure"), "hog_error": hog.get("error"),
    "memory_peak_bytes": h.get("memory_peak_bytes"), "memory_limit_bytes": h.get("memory_limit_bytes"),
    "oom_kills": h.get("oom_kills"), "isolation": h.get("isolation"),
    "sibling_status": sib.get("status"), "orchestrate_exit": console("oom").strip().splitlines()[-1],
    "console_says_oom": "OOM killer" in console("oom"),
}
s["oom"]["pass"] = (hog.get("failure") == "oom_killed" and h.get("memory_limit_bytes") == 256 << 20
    and (h.get("memory_peak_bytes") or 0) >= 200 << 20 and sib.get("status") == "succeeded"
    and s["oom"]["orchestrate_exit"] == "exit 1")
r = load("bomb.report.json"); b = stage(r, "bomb"); h = b.get("host") or {}; t = b.get("timing") or {}
left = int(re.search(r"left: (\d+)", console("bomb")).group(1))
s["bomb"] = {"status": b.get("status"), "pids_refused": h.get("pids_refused"), "isolation": h.get("isolation"),
    "leftovers": len(b.get("leftover_processes", [])),
    "exit_to_tree_gone_s": (t["tree_gone"] - t["exited"]) if t else None, "left_after_run": left}
s["bomb"]["pass"] = ((h.get("pids_refused") or 0) > 0 and left == 0 and s["bomb"]["leftovers"] > 0
    and s["bomb"]["exit_to_tree_gone_s"] is not None and s["bomb"]["exit_to_tree_gone_s"] <= 1.0)
r = load("escape.report.json"); e = stage(r, "escape"); c = console("escape")
s["escape"] = {"status": e.get("status"), "isolation": (e.get("host") or {}).get("isolation"),
    "leftovers": e.get("leftover_processes"),
    "left_after_run": int(re.search(r"left: (\d+)", c).group(1)),
    "run_cgroups_left": int(re.search(r"run cgroups left: (\d+)", c).group(1))}
s["escape"]["pass"] = (s["escape"]["isolation"] == "cgroup" and bool(e.get("leftover_processes"))
    and s["escape"]["left_after_run"] == 0 and s["escape"]["run_cgroups_left"] == 0)
o = load("overhead.json")
try:
    summ = next(iter(o["sizes"].values()))["summary"]
    s["overhead"] = {p: summ[p]["new_over_baseline"] for p in ("independent", "chain")}
    s["overhead"]["stages"] = next(iter(o["sizes"]))
    # new_over_baseline: stages/s with cgroups over stages/s without; 1.1x slower = 0.909.
    s["overhead"]["pass"] = all(v["median"] >= 1 / 1.1 for v in s["overhead"].values()
                                if isinstance(v, dict) and "median" in v)
except Exception as ex:
    s["overhead"] = {"error": repr(ex), "pass": False}
json.dump(s, open(f"{out}/summary.json", "w"), indent=1)
print(json.dumps(s, indent=1))
PY
