"""Which call starts the native thread that `import deepspeed` leaves in a process on a GPU
host (a zygote must not fork with it)? Each probe runs in a fresh interpreter and prints, after
each step, the threads besides the main one, whether the CUDA driver answers "initialised", and
the NVIDIA device files mapped. Usage: python3 nvml_probe.py > probes.txt"""
import json
import subprocess
import sys

PROBES = {
    "torch": ["import torch"],
    "torch+device_count(nvml)": ["import torch", "torch.cuda.device_count()"],
    "nvml via ctypes": ["import ctypes", "ctypes.CDLL('libnvidia-ml.so.1').nvmlInit_v2()"],
    "pynvml init+shutdown": ["import pynvml", "pynvml.nvmlInit()", "pynvml.nvmlShutdown()", "import time; time.sleep(0.2)"],
    "deepspeed": ["import torch", "import deepspeed"],
    "deepspeed, then pynvml shutdown": ["import torch", "import deepspeed", "import pynvml; pynvml.nvmlShutdown()", "import time; time.sleep(0.2)"],
    "deepspeed, pynvml hidden": ["import sys; sys.modules['pynvml'] = None", "import torch", "import deepspeed"],
}

CHILD = r'''
import ctypes, os, re, sys, json, time
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
def state():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task") if int(t) != os.getpid()]
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        n = ctypes.c_int(0); answer = cuda.cuDeviceGetCount(ctypes.byref(n))
    except OSError:
        answer = "libcuda not loaded"
    maps = sorted(set(re.findall(r"/dev/nvidia\S*", open("/proc/self/maps").read())))
    fds = []
    for f in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{f}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            fds.append(target)
    fds = sorted(set(fds))
    return {"threads": names, "cuDeviceGetCount": answer, "maps": maps, "open": fds}
for step in json.loads(sys.argv[1]):
    t = time.time(); exec(step, globals())
    print(json.dumps({"step": step, "s": round(time.time() - t, 2), **state()}), flush=True)
'''

for name, steps in PROBES.items():
    print(f"== {name}", flush=True)
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(steps)], capture_output=True, text=True, timeout=120)
    print(r.stdout.strip())
    if r.returncode:
        print("exit", r.returncode, r.stderr.strip()[-600:])
