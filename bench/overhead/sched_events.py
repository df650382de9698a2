"""The kernel scheduler's process events around one command, as `timeline.py` and
`run_ends.py` read them: `perf record -a` of the given tracepoints while the command runs, then
the events one per line (`perf script`), each matched by `LINE` into its command name, thread
id, time (seconds), event name and the tracepoint's own text.

Needs `perf` with access to the scheduler's tracepoints (root, or `perf_event_paranoid` <= -1).
"""
import re, subprocess

LINE = re.compile(r"\s*(\S+)\s+(\d+)\s+([\d.]+):\s+(\S+):\s+(.*)")


def record(command, events, data, env=None):
    """Runs `command` (an argv list) under `perf record -a -e EVENTS` into the file `data`; the
    recorded events as `perf script` prints them (command, tid, time, event, trace)."""
    subprocess.run(["perf", "record", "-q", "-a", "-e", events, "-o", data, "--"] + command,
                   env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return subprocess.run(["perf", "script", "-i", data, "-F", "comm,tid,time,event,trace"],
                          capture_output=True, text=True, check=True).stdout
