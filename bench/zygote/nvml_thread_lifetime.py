#!/usr/bin/env python3
"""Does NVML's native thread ever leave once NVML is shut down? (whether a zygote could
import a module that initialises NVML, shut NVML down and wait for the thread, then fork)

In a fresh interpreter: `pynvml.nvmlInit()`, `nvmlShutdown()`, then the process's threads
every 50 ms for 5 s; the same after `nvmlInit()` twice and `nvmlShutdown()` until NVML says it
is not initialised. Prints when (if ever) the thread left."""
import os
import time

import pynvml


def threads():
    me = os.getpid()
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip()
                  for t in os.listdir("/proc/self/task") if int(t) != me)


for inits in (1, 2):
    for _ in range(inits):
        pynvml.nvmlInit()
    during = threads()
    shutdowns = 0
    while True:
        try:
            pynvml.nvmlShutdown()
            shutdowns += 1
        except pynvml.NVMLError:
            break
    start = time.monotonic()
    left = None
    while time.monotonic() - start < 5:
        if threads() == []:
            left = time.monotonic() - start
            break
        time.sleep(0.05)
    print(f"{inits} init(s), {shutdowns} shutdown(s): threads during {during}; "
          + (f"none left {left * 1e3:.0f} ms after the last shutdown" if left is not None
             else f"still {threads()} 5 s after the last shutdown"), flush=True)
    if left is None:
        break
