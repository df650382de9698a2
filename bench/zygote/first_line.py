"""A Python stage's first line of user code comes right after its imports: the time it is
reached (Unix seconds) is its first output line. Then one CUDA result, to show that a stage
forked from the zygote makes its own context on its GPU (on a host without CUDA, the time,
0 and "cpu": the CPU rehearsal). DeepSpeed is imported when it is installed."""
import torch, transformers  # noqa: E401, F401
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401

try:
    import deepspeed  # noqa: F401
except ImportError:
    deepspeed = None
import time

print(time.time(), flush=True)
if torch.cuda.is_available():
    x = torch.ones(1024, device="cuda") * 2
    torch.cuda.synchronize()
    print(time.time(), float(x.sum()), torch.cuda.get_device_name(0), flush=True)
else:
    print(time.time(), 0, "cpu", flush=True)
