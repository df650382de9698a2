#!/usr/bin/env python3
"""How fast this host's page cache takes a checkpoint-sized file, by the ways stage-worker can
write one (stage-worker/src/checkpoint/writeback.rs): run by run.sh before the benchmark, in its work
directory (the file system the checkpoints go to).

  python3 disk_probe.py WORK_DIR OUT_JSON

Each trial writes 800 MB (64 MB under BENCH_TINY=1) in 32 MiB pwrites to a new file, then
fsyncs it, and reports the time to the page cache and to durable:
  threads-N      N threads, each its own chunks (no write-back until the fsync)
  behind         one writer, a second thread starting each chunk's write-back after it
  inline         one writer starting each chunk's write-back itself (the old loop)
Python's os.pwrite releases the GIL, so the threads' system calls run at once.
"""
import ctypes, json, os, sys, threading, time

WORK, OUT = sys.argv[1], sys.argv[2]
CHUNK = 32 << 20
SIZE = (64 << 20) if os.environ.get("BENCH_TINY") == "1" else (800 << 20)
libc = ctypes.CDLL(None, use_errno=True)
libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
SYNC_FILE_RANGE_WRITE = 2
DATA = os.urandom(CHUNK)


def trial(kind, threads=1):
    path = os.path.join(WORK, f"probe-{kind}-{threads}")
    fd = os.open(path, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    offsets = list(range(0, SIZE, CHUNK))
    written = []  # ranges for the write-back thread
    done = threading.Event()

    def writer(k):
        for i, at in enumerate(offsets):
            if i % threads != k:
                continue
            os.pwrite(fd, DATA, at)
            if kind == "inline":
                libc.sync_file_range(fd, at, CHUNK, SYNC_FILE_RANGE_WRITE)
            elif kind == "behind":
                written.append(at)

    def flusher():
        taken = 0
        while not (done.is_set() and taken == len(written)):
            if taken < len(written):
                libc.sync_file_range(fd, written[taken], CHUNK, SYNC_FILE_RANGE_WRITE)
                taken += 1
            else:
                time.sleep(0.0005)

    t0 = time.time()
    back = threading.Thread(target=flusher) if kind == "behind" else None
    if back:
        back.start()
    ws = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    cached = time.time() - t0
    done.set()
    if back:
        back.join()
    os.fsync(fd)
    durable = time.time() - t0
    os.close(fd)
    os.remove(path)
    return {"kind": kind if kind != "threads" else f"threads-{threads}", "bytes": SIZE,
            "page_cache_s": round(cached, 4), "durable_s": round(durable, 4),
            "page_cache_gb_s": round(SIZE / cached / 1e9, 2)}


def main():
    os.makedirs(WORK, exist_ok=True)
    results = []
    for r in range(2):
        for kind, threads in (("threads", 1), ("threads", 2), ("threads", 4), ("behind", 1), ("inline", 1)):
            res = trial(kind, threads)
            res["round"] = r
            print(f"disk probe: {res['kind']}: page cache {res['page_cache_s']} s "
                  f"({res['page_cache_gb_s']} GB/s), durable {res['durable_s']} s", flush=True)
            results.append(res)
    with open(OUT, "w") as f:
        json.dump(results, f, indent=1)


main()
