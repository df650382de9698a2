"""What the web view costs the daemon: a 10,000-stage sweep (one `matrix` stage of `true`
commands) run by a daemon started with `--http`, with no page open and with 50 pages open
(50 server-sent-event streams of the run, read by one client process as a browser would:
every byte read; each page's stage ends and run end counted). Fresh daemon per trial; trials alternate between the two
modes.

    python3 bench/web/bench.py ORCHESTRATE_BIN WORKDIR [STAGES] [PAGES] [TRIALS]

Per trial: the daemon's CPU seconds (user + system, from /proc/PID/stat, from the submit to
the run's end) and the stage rate (stages / seconds from the submit to the run's end). Prints
one JSON object.
"""
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import threading
import time

# The client from the repository's python/, or from beside this file (a copy of the bench
# carried to another machine with the binary).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from orchestrate_client import Client  # noqa: E402

orchestrate, work = sys.argv[1], sys.argv[2]
stages = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
pages = int(sys.argv[4]) if len(sys.argv) > 4 else 50
trials = int(sys.argv[5]) if len(sys.argv) > 5 else 3
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime, cutime, cstime: fields 14-17 (1-based) are 11-14 after the ")".
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# What each page must have received, counted across reads: every stage's end (a large run's
# batches keep each stage's latest state; a `true` stage's is its `stage_finished`), the
# run's end event, and the stream's `end`.
PATTERNS = {"stage_finished": b'"event":"stage_finished"', "run_finished": b'"event":"run_finished"',
            "end": b"event: end\n", "messages": b"data: "}


def readers(port, token, run_id, n, stop, counts):
    """n SSE streams of the run, read to their end in one thread."""
    sel = selectors.DefaultSelector()
    tails = [b""] * n
    longest = max(len(p) for p in PATTERNS.values())
    for i in range(n):
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall((f"GET /api/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                   f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n").encode())
        c.setblocking(False)
        sel.register(c, selectors.EVENT_READ, i)
    open_ = n
    while open_ and not stop.is_set():
        for key, _ in sel.select(timeout=0.5):
            try:
                data = key.fileobj.recv(1 << 16)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
                open_ -= 1
            else:
                # Count across reads: each pattern over the end of the last read (shorter
                # than the pattern, so nothing is counted twice) and this one.
                tail = tails[key.data]
                for name, pattern in PATTERNS.items():
                    counts[key.data][name] += (tail[max(0, len(tail) - len(pattern) + 1):] + data).count(pattern)
                counts[key.data]["bytes"] += len(data)
                tails[key.data] = (tail + data)[-(longest - 1):]


def trial(k, n_pages):
    base = os.path.join(work, f"t{k}")
    subprocess.run(["rm", "-rf", base])
    os.makedirs(base)
    with open(os.path.join(base, "ids.txt"), "w") as f:
        f.write("".join(f"{i}\n" for i in range(stages)))
    sock = os.path.join(base, "sock", "d.sock")
    port = free_port()
    daemon = subprocess.Popen([orchestrate, "daemon", "--socket", sock, "--runs-dir",
                               os.path.join(base, "runs"), "--http", f"127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    token_file = sock + ".web-token"
    for _ in range(400):
        if os.path.exists(sock) and os.path.exists(token_file):
            break
        time.sleep(0.05)
    time.sleep(0.3)
    token = open(token_file).read().strip()
    plan = ('[run]\nname = "sweep"\n[[stage]]\nname = "t"\ncommand = ["true"]\n'
            'matrix = { i = { lines = "ids.txt" } }\n')
    counts = [dict.fromkeys([*PATTERNS, "bytes"], 0) for _ in range(n_pages)]
    stop = threading.Event()
    try:
        with Client(sock, timeout=3600) as c:
            cpu0, t0 = cpu_s(daemon.pid), time.time()
            run = c.submit(toml=plan, base_dir=base)
            reader = None
            if n_pages:
                reader = threading.Thread(target=readers, args=(port, token, run["id"], n_pages, stop, counts))
                reader.start()
            final = c.wait(run["id"])
            t1, cpu1 = time.time(), cpu_s(daemon.pid)
            assert final["state"] == "succeeded", final
            assert final["succeeded"] == stages, final
            if reader:
                reader.join(timeout=120)
                stop.set()
        return {"pages": n_pages, "stages": stages, "wall_s": t1 - t0, "daemon_cpu_s": cpu1 - cpu0,
                "stages_per_s": stages / (t1 - t0), "events_each_page_read": counts,
                "events_of_run": final["events"]}
    finally:
        stop.set()
        daemon.terminate()
        daemon.wait(timeout=60)
        # The run directories are removed at the end (removing 10,000 stage directories
        # between trials would load the disk under the next one).


results = []
for k in range(trials):
    for n in (0, pages) if k % 2 == 0 else (pages, 0):
        r = trial(len(results), n)
        print(json.dumps({x: r[x] for x in ("pages", "wall_s", "daemon_cpu_s", "stages_per_s")}), file=sys.stderr)
        results.append(r)


def summary(n):
    rs = [r for r in results if r["pages"] == n]
    return {"daemon_cpu_s": statistics.median(r["daemon_cpu_s"] for r in rs),
            "daemon_cpu_s_all": [r["daemon_cpu_s"] for r in rs],
            "stages_per_s": statistics.median(r["stages_per_s"] for r in rs),
            "stages_per_s_all": [r["stages_per_s"] for r in rs]}


for k in range(len(results)):
    subprocess.run(["rm", "-rf", os.path.join(work, f"t{k}")])
none, some = summary(0), summary(pages)
out = {"stages": stages, "pages": pages, "trials": trials, "no_page": none, "pages_open": some,
       "cpu_ratio": some["daemon_cpu_s"] / none["daemon_cpu_s"],
       "rate_ratio": some["stages_per_s"] / none["stages_per_s"],
       "every_page_read_every_stage_end_and_the_run_end": all(
           c["stage_finished"] == stages and c["run_finished"] == 1 and c["end"] == 1
           for r in results if r["pages"] for c in r["events_each_page_read"]),
       "trials_detail": results}
print(json.dumps(out))
