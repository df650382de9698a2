"""Drives the real daemon with python/orchestrate_client.py (standard library only).

Usage: python3 client_check.py SOCKET WORKDIR. Exits 0 when every check passed; prints what
failed otherwise. Run by tests/tests/e2e/daemon.rs against a daemon it started.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from orchestrate_client import Client, DaemonError  # noqa: E402

sock, work = sys.argv[1], sys.argv[2]

PLAN = """
[[stage]]
name = "make"
command = ["sh", "-c", "echo 41 > {output}/n"]
outputs = ["n"]

[[stage]]
name = "add"
after = ["make"]
command = ["python3", "add.py", "{input.make}/n", "{output}/n"]
outputs = ["n"]
"""

with open(os.path.join(work, "add.py"), "w") as f:
    f.write("import sys\nopen(sys.argv[2], 'w').write(str(int(open(sys.argv[1]).read()) + 1))\n")

with Client(sock, timeout=60) as c:
    assert c.hello["type"] == "hello" and c.hello["v"] == 1, c.hello
    run = c.submit(toml=PLAN, base_dir=work, client_id="py-check-1")
    assert run["existing"] is False, run
    again = c.submit(toml=PLAN, base_dir=work, client_id="py-check-1")
    assert again["id"] == run["id"] and again["existing"] is True, again

    events = list(c.watch(run["id"]))
    seqs = [e["seq"] for e in events]
    assert seqs == list(range(len(seqs))), seqs
    kinds = [e["event"]["event"] for e in events]
    assert "stage_started" in kinds and kinds[-1] == "run_finished", kinds
    final = c.wait(run["id"])
    assert final["state"] == "succeeded" and final["exit_code"] == 0, final
    with open(os.path.join(final["run_dir"], "stages", "add", "output", "n")) as f:
        assert f.read() == "42"

    # A plan as a JSON object, and a plan the daemon refuses.
    plan = {"stage": [{"name": "j", "command": ["true"]}]}
    j = c.submit(plan=plan)
    assert c.wait(j["id"])["state"] == "succeeded"
    try:
        c.submit(toml="[[stage]]\nname = 3\n")
        raise AssertionError("an invalid plan was accepted")
    except DaemonError as e:
        assert e.code == "invalid_plan", e

    # Cancel a long run.
    slow = c.submit(toml='[[stage]]\nname = "slow"\ncommand = ["sleep", "60"]\n')
    c.cancel(slow["id"])
    state = c.wait(slow["id"])
    assert state["state"] == "interrupted", state

    listed = [r["id"] for r in c.runs()]
    assert run["id"] in listed and slow["id"] in listed, listed
    try:
        c.status("no-such-run")
        raise AssertionError("an unknown id was answered")
    except DaemonError as e:
        assert e.code == "not_found", e

print(json.dumps({"ok": True, "run": run["id"]}))
