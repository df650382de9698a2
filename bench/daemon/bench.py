"""The daemon's benchmark: submissions per second, delay from a stage's event to a watching
client, and the daemon's memory after 1,000 finished runs.

    python3 bench/daemon/bench.py ORCHESTRATE_BIN WORKDIR RUNS [REPEATS]

Each repeat starts a fresh daemon (its own socket and runs directory), so every figure has a
spread. Prints one JSON object.
"""
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from orchestrate_client import Client  # noqa: E402

orchestrate, work, n_runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3

EMITTER = r"""
import json, os, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(os.environ["ORCHESTRATE_EVENTS"])
sent = []
for step in range(1, 7):
    time.sleep(2.1)   # the console shows a stage's progress at most every 2 s
    t = time.time()
    s.sendall((json.dumps({"v": 1, "event": "progress", "step": step, "total_steps": 6}) + "\n").encode())
    sent.append(t)
open(os.path.join(os.environ["ORCHESTRATE_OUTPUT_DIR"], "sent.json"), "w").write(json.dumps(sent))
"""


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def one(rep):
    base = os.path.join(work, f"rep{rep}")
    subprocess.run(["rm", "-rf", base])
    os.makedirs(base)
    sock = os.path.join(base, "sock", "d.sock")
    daemon = subprocess.Popen([orchestrate, "daemon", "--socket", sock, "--runs-dir",
                               os.path.join(base, "runs")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    time.sleep(0.2)
    out = {"rss_start_kib": rss_kib(daemon.pid)}
    with open(os.path.join(base, "emit.py"), "w") as f:
        f.write(EMITTER)
    with Client(sock, timeout=600) as c:
        # Event delay: a stage sends progress events; a watcher notes when each arrives.
        run = c.submit(toml='[[stage]]\nname = "emit"\ncommand = ["python3", "emit.py"]\n',
                       base_dir=base)
        got = {}
        with Client(sock, timeout=600) as w:
            for e in w.watch(run["id"]):
                ev = e["event"]
                if ev["event"] == "progress":
                    got[ev["step"]] = time.time()
        sent = json.load(open(os.path.join(run["run_dir"], "stages", "emit", "output", "sent.json")))
        delays = [1000 * (got[i + 1] - t) for i, t in enumerate(sent) if (i + 1) in got]
        out["event_delay_ms"] = delays
        # Submissions per second: one client, one connection, no-op plans.
        plan = '[[stage]]\nname = "noop"\ncommand = ["true"]\n'
        t0 = time.time()
        ids = [c.submit(toml=plan, base_dir=base)["id"] for _ in range(n_runs)]
        t1 = time.time()
        for i in ids:
            assert c.wait(i)["state"] == "succeeded"
        t2 = time.time()
        out["submits_per_s"] = n_runs / (t1 - t0)
        out["runs_finished_per_s"] = n_runs / (t2 - t0)
        time.sleep(0.5)
        out["rss_after_kib"] = rss_kib(daemon.pid)
        out["runs_finished"] = len(ids) + 1
        c.shutdown()
    daemon.wait(timeout=60)
    return out


reps = [one(r) for r in range(repeats)]


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


summary = {
    "runs_per_repeat": n_runs,
    "repeats": repeats,
    "submits_per_s": spread([r["submits_per_s"] for r in reps]),
    "runs_finished_per_s": spread([r["runs_finished_per_s"] for r in reps]),
    "event_delay_ms": spread([d for r in reps for d in r["event_delay_ms"]]),
    "rss_start_mib": spread([r["rss_start_kib"] / 1024 for r in reps]),
    "rss_after_runs_mib": spread([r["rss_after_kib"] / 1024 for r in reps]),
    "raw": reps,
}
print(json.dumps(summary, indent=1))
