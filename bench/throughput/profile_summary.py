#!/usr/bin/env python3
"""Where a training step's GPU time goes, from Chrome traces of libtorch's profiler (the
worker's STAGE_WORKER_PROFILE, or torch.profiler's export_chrome_trace of the peers).

  profile_summary.py STEPS TRACE.json...

Per trace: GPU time per step by kind of kernel (kernels, copies and fills, summed), the
number of kernels per step, the span from the first GPU activity to the last divided by the
steps, and the share of that span the GPU was busy."""
import gzip, json, re, sys
from collections import defaultdict

KINDS = [
    ("attention", r"fmha|flash|attention|efficient|cudnn|sdpa"),
    ("matmul", r"gemm|nvjet|cutlass|sm90_xmma|cublas|splitK"),
    ("triton (fused)", r"^triton_"),
    ("layer_norm", r"layer_norm|LayerNorm|stage_worker_ln_|rms_norm|RmsNorm"),
    ("gelu", r"gelu|GeluCUDA"),
    ("silu/swiglu", r"silu|swiglu"),
    ("rotary", r"rotary|rope"),
    ("adamw", r"adam|Adam"),
    ("norm/reduce", r"reduce_kernel|norm|Norm|multi_tensor|stage_worker_colsum|stage_worker_opt_sumsq|stage_worker_opt_finish"),
    ("softmax/loss", r"softmax|nll|cross_entropy|log_softmax|stage_worker_xent"),
    ("embedding", r"embedding|stage_worker_embed|indexSelect|index_select|sort|radix|unique|compute_grad_weight|sum_and_scatter|krn_partial"),
    ("copy/cast", r"copy|Copy|cast|Memcpy|catArray|CatArray|to_copy"),
    ("fill", r"fill|Memset|zero"),
    ("elementwise", r"elementwise|vectorized|unrolled|Add|Mul|add|mul"),
]


def kind_of(name):
    for k, pat in KINDS:
        if re.search(pat, name):
            return k
    return "other"


def summarise(path, steps):
    opener = gzip.open if path.endswith(".gz") else open
    events = json.load(opener(path, "rt"))["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return f"{path}: no GPU activity in the trace\n"
    by = defaultdict(float)
    count = defaultdict(int)
    names = defaultdict(float)
    for e in gpu:
        k = kind_of(e["name"])
        by[k] += e["dur"]
        count[k] += 1
        names[e["name"][:90]] += e["dur"]
    start = min(e["ts"] for e in gpu)
    end = max(e["ts"] + e["dur"] for e in gpu)
    busy = sum(by.values())
    out = [f"### {path}", "",
           f"span per step {((end - start) / steps) / 1000:.2f} ms, GPU busy per step {busy / steps / 1000:.2f} ms "
           f"({100 * busy / (end - start):.1f}% of the span), {len(gpu) / steps:.0f} GPU activities per step", "",
           "| kind | ms per step | share | per step |", "|---|---|---|---|"]
    for k, v in sorted(by.items(), key=lambda kv: -kv[1]):
        out.append(f"| {k} | {v / steps / 1000:.3f} | {100 * v / busy:.1f}% | {count[k] / steps:.0f} |")
    out += ["", "Top kernels (ms per step):", ""]
    for n, v in sorted(names.items(), key=lambda kv: -kv[1])[:14]:
        out.append(f"- {v / steps / 1000:.3f} `{n}`")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    steps = int(sys.argv[1])
    for p in sys.argv[2:]:
        print(summarise(p, steps))
