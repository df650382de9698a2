"""The health gate's NVML reads for each GPU (what orchestrate's gate calls: uncorrectable
volatile ECC count, remapped rows, retired pages of both causes, pending retirement), timed
ROUNDS times; prints per GPU the median and range in milliseconds, and the counters."""
import statistics, sys, time
import pynvml as n

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    uuid = n.nvmlDeviceGetUUID(h)
    times, seen = [], {}
    for _ in range(rounds):
        t = time.perf_counter()
        for name, call in (
            ("uncorrectable_ecc", lambda: n.nvmlDeviceGetTotalEccErrors(h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)),
            ("remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(h)),
            ("retired_dbe", lambda: len(n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))),
            ("retired_sbe", lambda: len(n.nvmlDeviceGetRetiredPages(h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS))),
            ("pending_retirement", lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h)),
        ):
            try:
                seen[name] = call()
            except n.NVMLError as e:
                seen[name] = f"n/a ({e})"
        times.append((time.perf_counter() - t) * 1000)
    print(f"gate {uuid}: median {statistics.median(times):.3f} ms, range {min(times):.3f}-{max(times):.3f} ms over {rounds} runs; {seen}")
