"""A Python stage's first line of user code comes right after its imports: the time it is
reached (Unix seconds) is its first output line. Then one CUDA result, to show that a stage
forked from the zygote makes its own context on its GPU."""
import torch, transformers, deepspeed  # noqa: E401
from transformers import LlamaForCausalLM  # noqa: F401
import time

print(time.time(), flush=True)
x = torch.ones(1024, device="cuda") * 2
torch.cuda.synchronize()
print(time.time(), float(x.sum()), torch.cuda.get_device_name(0), flush=True)
