#!/usr/bin/env python3
"""How fast this host's disk takes one checkpoint's bytes, written in different ways (a probe
for the checkpoint writer, run by bench.py when PARTS has `probe`):
  dd        dd bs=16M conv=fsync (the benchmark's reference)
  buf1      one file, 32 MiB write()s, sync_file_range after each, fsync
  buf2      two files in parallel, 1/3 and 2/3 of the bytes (stage-worker's model/optimizer split)
  buf4      four files in parallel, a quarter each
  direct4   four files in parallel, O_DIRECT 32 MiB writes, fsync
  direct1x4 one file, four threads writing disjoint quarters with O_DIRECT, fsync
Usage: probe.py DIR NBYTES REPS; prints one JSON object."""
import ctypes, json, mmap, os, subprocess, sys, threading, time

DIR, NBYTES, REPS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CHUNK = 32 << 20
libc = ctypes.CDLL(None, use_errno=True)
BUF = mmap.mmap(-1, CHUNK)
BUF.write(os.urandom(CHUNK))
VIEW = memoryview(BUF)


def sfr(fd, off, n):
    libc.sync_file_range(ctypes.c_int(fd), ctypes.c_longlong(off), ctypes.c_longlong(n), ctypes.c_uint(2))


def write_buffered(path, nbytes):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    at = 0
    while at < nbytes:
        n = min(CHUNK, nbytes - at)
        os.write(fd, VIEW[:n])
        sfr(fd, at, n)
        at += n
    os.fsync(fd)
    os.close(fd)


def write_direct(path, nbytes, start=0, fd=None):
    own = fd is None
    if own:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    at = start
    end = start + nbytes
    while at < end:
        n = min(CHUNK, end - at)
        n = (n + 4095) // 4096 * 4096
        os.pwrite(fd, VIEW[:n], at)
        at += n
    if own:
        os.fsync(fd)
        os.close(fd)


def parallel(jobs):
    ts = [threading.Thread(target=f, args=a) for f, a in jobs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def variant(name, rep):
    base = os.path.join(DIR, f"probe-{name}-{rep}")
    q = (NBYTES // 4 + 4095) // 4096 * 4096
    if name == "dd":
        subprocess.run(["dd", "if=/dev/zero", f"of={base}", "bs=16M",
                        f"count={(NBYTES + (16 << 20) - 1) // (16 << 20)}", "conv=fsync"],
                       capture_output=True, check=True)
    elif name == "buf1":
        write_buffered(base, NBYTES)
    elif name == "buf2":
        parallel([(write_buffered, (base + ".a", NBYTES // 3)), (write_buffered, (base + ".b", NBYTES - NBYTES // 3))])
    elif name == "buf4":
        parallel([(write_buffered, (f"{base}.{i}", NBYTES // 4)) for i in range(4)])
    elif name == "direct4":
        parallel([(write_direct, (f"{base}.{i}", q)) for i in range(4)])
    elif name == "direct1x4":
        fd = os.open(base, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
        parallel([(write_direct, (base, q, i * q, fd)) for i in range(4)])
        os.fsync(fd)
        os.close(fd)
    dfd = os.open(DIR, os.O_RDONLY)
    os.fsync(dfd)
    os.close(dfd)


def main():
    os.makedirs(DIR, exist_ok=True)
    out = {"bytes": NBYTES, "variants": {}}
    for name in ("dd", "buf1", "buf2", "buf4", "direct4", "direct1x4"):
        times = []
        for rep in range(REPS):
            subprocess.run(["sync"])
            t0 = time.time()
            try:
                variant(name, rep)
            except Exception as e:  # report, keep going
                out["variants"][name] = {"error": repr(e)}
                break
            times.append(time.time() - t0)
            for f in os.listdir(DIR):
                if f.startswith("probe-"):
                    os.remove(os.path.join(DIR, f))
        if times:
            out["variants"][name] = {"wall_s": times, "median_s": sorted(times)[len(times) // 2]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
