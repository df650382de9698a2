"""A client of `orchestrate daemon`, standard library only (socket + json).

    from orchestrate_client import Client
    with Client() as c:                       # the daemon's default per-user socket
        run = c.submit(toml=open("plan.toml").read(), base_dir=".")
        for event in c.watch(run["id"]):      # events until the run ends
            print(event)
        print(c.wait(run["id"])["state"])     # "succeeded", "failed", ...

Every method sends one request (one JSON line with "v": 1 and a "type") and reads the
answer; an error answer raises DaemonError with its code and text. `watch` streams on a
connection of its own, so a loop over it may be left at any point. docs/protocol.md has
every message.
"""

import json
import os
import socket

PROTOCOL_VERSION = 1


def default_socket():
    """The path `orchestrate daemon` listens on by default."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "orchestrate", "daemon.sock")
    return f"/tmp/orchestrate-{os.getuid()}/daemon.sock"


class DaemonError(Exception):
    """The daemon refused a request: `code` says what kind of problem, the text what."""

    def __init__(self, code, error):
        super().__init__(f"{code}: {error}")
        self.code = code
        self.error = error


class Client:
    """One connection to the daemon for requests and answers; each `watch` streams on a
    connection of its own, so leaving one early leaves this one as it was."""

    def __init__(self, path=None, timeout=None):
        self.path = path or default_socket()
        self.timeout = timeout
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(self.path)
        self.reader = self.sock.makefile("rb")
        self.hello = self._read()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.reader.close()
        self.sock.close()

    def _read(self):
        line = self.reader.readline()
        if not line:
            raise ConnectionError("the daemon closed the connection")
        answer = json.loads(line)
        if answer.get("type") == "error":
            raise DaemonError(answer.get("code"), answer.get("error"))
        return answer

    def _send(self, kind, **fields):
        request = {"v": PROTOCOL_VERSION, "type": kind}
        request.update({k: v for k, v in fields.items() if v is not None})
        self.sock.sendall(json.dumps(request).encode() + b"\n")

    def call(self, kind, **fields):
        """Sends one request and returns its answer (a dict)."""
        self._send(kind, **fields)
        return self._read()

    def submit(self, toml=None, plan=None, path=None, base_dir=None, client_id=None, priority=0):
        """Submits a plan given as TOML text, a dict (JSON) or a file path; returns
        {"id", "run_dir", "existing"}. A repeated `client_id` returns the first run."""
        if sum(x is not None for x in (toml, plan, path)) != 1:
            raise ValueError("give exactly one of toml=, plan= or path=")
        if toml is not None:
            source = {"toml": toml}
        elif plan is not None:
            source = {"json": plan}
        else:
            source = {"path": os.path.abspath(path)}
        if base_dir is not None:
            base_dir = os.path.abspath(base_dir)
        return self.call("submit", plan=source, base_dir=base_dir, client_id=client_id,
                         priority=priority)

    def status(self, run_id=None):
        """One run's state (a dict), or every run's (a list)."""
        runs = self.call("status", id=run_id)["runs"]
        return runs[0] if run_id is not None else runs

    def runs(self):
        """Every run the daemon knows."""
        return self.call("list")["runs"]

    def watch(self, run_id, start=0):
        """Yields the run's events (dicts with "seq" and "event") from `start` until it ends;
        then returns. The final state is what `wait` gives (and `last_finished` holds).

        The events come on a connection of the watch's own, closed when the loop ends or is
        left (`break`, an exception): the rest of the stream is never read as an answer to a
        later request on this client."""
        with Client(self.path, self.timeout) as stream:
            stream._send("watch", id=run_id, **({"from": start} if start else {}))
            while True:
                answer = stream._read()
                if answer["type"] == "finished":
                    self.last_finished = answer["run"]
                    return
                yield answer

    def wait(self, run_id):
        """Blocks until the run has ended; its final state."""
        return self.call("wait", id=run_id)["run"]

    def cancel(self, run_id, kill=False):
        """Stops a run: SIGTERM and grace for its stages (kill: SIGKILL now)."""
        return self.call("cancel", id=run_id, kill=kill)

    def shutdown(self, cancel=False):
        """Stops the daemon once its runs end (cancel: stop them gracefully first)."""
        return self.call("shutdown", mode="cancel" if cancel else "drain")

    def release_gpu(self, gpu):
        """Gives a quarantined GPU (its NVML index or UUID) back to stages once the driver
        shows it empty; raises DaemonError (code "refused") naming what still holds it."""
        return self.call("release_gpu", gpu=str(gpu))
