#!/usr/bin/env python3
"""Peers of the orchestration-overhead benchmark: N no-op child processes run one after
another, by (1) a subprocess.run loop, (2) multiprocessing with the spawn start method,
(3) Ray tasks with max_calls=1 (a fresh worker process per task), when Ray is installed.
Prints one JSON object: {"peer": stages_per_second, ...}."""
import json, multiprocessing as mp, subprocess, sys, time


def noop():
    pass


def bench_subprocess(n):
    t = time.perf_counter()
    for _ in range(n):
        subprocess.run(["true"], check=True)
    return n / (time.perf_counter() - t)


def bench_spawn(n):
    ctx = mp.get_context("spawn")
    t = time.perf_counter()
    for _ in range(n):
        p = ctx.Process(target=noop)
        p.start()
        p.join()
    return n / (time.perf_counter() - t)


def bench_ray(n):
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote(max_calls=1)
    def task():
        return 0

    ray.get(task.remote())  # warm: the cluster is up before timing
    t = time.perf_counter()
    for _ in range(n):
        ray.get(task.remote())
    rate = n / (time.perf_counter() - t)
    ray.shutdown()
    return rate


if __name__ == "__main__":
    n = int(sys.argv[1])
    out = {"subprocess_run_loop": bench_subprocess(n), "multiprocessing_spawn": bench_spawn(n)}
    try:
        out["ray_max_calls_1"] = bench_ray(int(sys.argv[2]) if len(sys.argv) > 2 else n)
    except ImportError:
        out["ray_max_calls_1"] = None
    print(json.dumps(out))
