"""Leaves a `watch` of python/orchestrate_client.py early and checks the client still works.

Usage: python3 watch_break_check.py SOCKET WORKDIR. Prints "all checks passed" and exits 0
when every check passed; raises otherwise. Run by tests/tests/e2e/daemon_requests.rs against a
daemon it started.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from orchestrate_client import Client  # noqa: E402

sock, work = sys.argv[1], sys.argv[2]

PLAN = """
[[stage]]
name = "a"
command = ["sh", "-c", "echo a"]

[[stage]]
name = "b"
after = ["a"]
command = ["sh", "-c", "echo b"]
"""

with Client(sock, timeout=60) as c:
    run = c.submit(toml=PLAN, base_dir=work)
    # Wait until the run has ended, so the watch below has a whole backlog to leave unread.
    assert c.wait(run["id"])["state"] == "succeeded"
    for event in c.watch(run["id"]):
        assert event["type"] == "event", event
        break
    # The same client answers the next requests with their own answers.
    final = c.wait(run["id"])
    assert final["id"] == run["id"] and final["state"] == "succeeded", final
    runs = c.runs()
    assert [r["id"] for r in runs] == [run["id"]], runs
    assert c.status(run["id"])["succeeded"] == 2
    # Left early twice over, then read to the end: every event, in order.
    for _ in c.watch(run["id"]):
        break
    seqs = [e["seq"] for e in c.watch(run["id"])]
    assert seqs == list(range(len(seqs))) and seqs, seqs
    assert c.last_finished["state"] == "succeeded"
print("all checks passed")
