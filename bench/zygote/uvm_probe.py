"""Which preload import opens /dev/nvidia-uvm or initialises the CUDA driver, and whether a
child forked afterwards can still use CUDA (PYTORCH_NVML_BASED_CUDA_CHECK=1)."""
import ctypes, json, os, sys, time
os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"

def signs():
    out = {}
    out["uvm_fd"] = any(os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia-uvm")
                        for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))
    out["nvidia_fds"] = sorted({os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                               if os.path.exists(f"/proc/self/fd/{fd}") and os.readlink(f"/proc/self/fd/{fd}").startswith("/dev/nvidia")})
    out["maps_dev"] = sorted({l.split()[5] for l in open("/proc/self/maps") if len(l.split()) > 5 and l.split()[5].startswith("/dev/nvidia")})
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        n = ctypes.c_int(0)
        out["cuDeviceGetCount"] = cuda.cuDeviceGetCount(ctypes.byref(n))
    except OSError:
        out["cuDeviceGetCount"] = "libcuda not loaded"
    t = sys.modules.get("torch")
    out["torch_initialized"] = bool(t and t.cuda.is_initialized())
    return out

steps = []
t0 = time.time()
import torch
steps.append(("torch", time.time() - t0, signs()))
from transformers import LlamaForCausalLM, LlamaConfig
steps.append(("transformers", time.time() - t0, signs()))
try:
    import triton
    steps.append(("triton", time.time() - t0, signs()))
except Exception as e:
    steps.append(("triton", repr(e), {}))
import deepspeed
steps.append(("deepspeed", time.time() - t0, signs()))
for s in steps:
    print(json.dumps(s), flush=True)
results = []
for k in range(2):
    r, w = os.pipe()
    t = time.time()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.close(r)
        try:
            m = LlamaForCausalLM(LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=4, vocab_size=1000)).cuda()
            y = m(torch.randint(0, 1000, (2, 16), device="cuda")).logits.float().sum().item()
            msg = {"ok": True, "s_after_fork": time.time() - t, "sum": y}
        except Exception as e:
            msg = {"ok": False, "error": repr(e)[:400]}
        os.write(w, json.dumps(msg).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    results.append(json.loads(os.read(r, 4096) or b'{"ok": false, "error": "no answer"}'))
print(json.dumps({"children": results, "parent_after": signs()}), flush=True)
