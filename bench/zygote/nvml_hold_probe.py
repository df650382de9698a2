#!/usr/bin/env python3
"""Does `import torch, deepspeed` leave a process fit to fork under the zygote's NVML hold?

    python3 bench/zygote/nvml_hold_probe.py [--gpus N] [--modules torch,deepspeed]

Imports MODULES in a fresh interpreter twice, each as the zygote imports them
(`PYTORCH_NVML_BASED_CUDA_CHECK=1`, `CUDA_VISIBLE_DEVICES` as given): once under
`orchestrate_zygote.NvmlHold(N)` and once without it, and prints, as JSON, for each: the import
time, DeepSpeed's accelerator, the NVML inits the hold left to the stages, and the zygote's own
verdicts (`threads_running`, `cuda_touched`: None means fit to fork).

On a GPU host it runs against the driver's NVML. On a machine without one, point
LD_LIBRARY_PATH at a stand-in `libnvidia-ml.so.1` (tests/fixtures/fake_nvml.c, whose init starts
a thread) and set CUDA_VISIBLE_DEVICES to a GPU UUID."""
import argparse, json, os, subprocess, sys, time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import orchestrate_zygote as z
gpus, modules, held = int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4] == "held"
hold = z.NvmlHold(gpus)
if held:
    hold.install()
started = time.monotonic()
failed = None
for name in modules:
    try:
        __import__(name)
    except BaseException as error:
        failed = f"{name}: {error!r}"
        break
seconds = time.monotonic() - started
accelerator = None
if "deepspeed" in sys.modules:
    accelerator = sys.modules["deepspeed"].get_accelerator()._name
print(json.dumps({"held": held, "import_s": round(seconds, 2), "failed": failed,
                  "accelerator": accelerator, "inits_left_to_stages": len(hold.recorded),
                  "threads_running": z.threads_running(), "cuda_touched": z.cuda_touched()}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs the zygote's stages get (default: CUDA_VISIBLE_DEVICES's entries)")
    ap.add_argument("--modules", default="torch,deepspeed")
    args = ap.parse_args()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = args.gpus if args.gpus is not None else len([e for e in (visible or "").split(",") if e])
    env = dict(os.environ, PYTORCH_NVML_BASED_CUDA_CHECK="1")
    rows = []
    for mode in ("held", "plain"):
        out = subprocess.run([sys.executable, "-c", CHILD, REPO, str(gpus), args.modules, mode],
                             env=env, capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
        rows.append(json.loads(lines[-1]) if lines else {"held": mode == "held", "error": out.stderr[-2000:]})
    print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "python": sys.version.split()[0], "modules": args.modules,
                      "CUDA_VISIBLE_DEVICES": visible, "gpus": gpus, "runs": rows}, indent=1))


if __name__ == "__main__":
    main()
