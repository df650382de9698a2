"""What the zygote's check before each fork costs, with torch and transformers' Llama classes
imported: stat'ing every recorded file (`changed_on_disk`, the check without a watch) against
a look at the inotify watch when nothing changed (`LoadedFiles.changed`). RUNS (default 20)
of each; median and range. Usage: PYTHON=... python3 stale_check_probe.py [RUNS]"""
import os
import statistics
import sys
import time

RUNS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
here = os.path.dirname(os.path.abspath(__file__))
zygote = {"__name__": "orchestrate_zygote_probe"}
with open(os.path.join(here, "../../python/orchestrate_zygote.py")) as f:
    exec(compile(f.read(), "orchestrate_zygote.py", "exec"), zygote)

import torch  # noqa: E402,F401
from transformers import LlamaForCausalLM  # noqa: E402,F401

files = zygote["LoadedFiles"]()
assert files.fd is not None, "no inotify watch"


def timed(check):
    out = []
    for _ in range(RUNS):
        t = time.perf_counter()
        check()
        out.append((time.perf_counter() - t) * 1000)
    return out


full = timed(lambda: zygote["changed_on_disk"](files.recorded))
watched = timed(files.changed)
print(f"{len(files.recorded)} recorded paths")
for label, xs in (("stat every file", full), ("inotify look, nothing changed", watched)):
    print(f"{label:31} median {statistics.median(xs):.3f} ms  range {min(xs):.3f}-{max(xs):.3f} ms  n={len(xs)}")
