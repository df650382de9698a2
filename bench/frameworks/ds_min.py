"""The smallest DeepSpeed stage: a small Llama from a config, ZeRO stage 2, bf16, a few steps,
run as one process (RANK 0 of 1). orchestrate gives MASTER_PORT; the rest defaults here.
Writes the final loss and the peak memory to the output directory."""
import json
import os
import time

os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29500")
start = time.time()
import deepspeed
import torch
from transformers import LlamaConfig, LlamaForCausalLM

imported = time.time()
config = LlamaConfig(vocab_size=256, hidden_size=512, intermediate_size=1376,
                     num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
model = LlamaForCausalLM(config)
ds_config = {
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
    "zero_optimization": {"stage": 2},
    "bf16": {"enabled": True},
}
deepspeed.init_distributed()
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                       config=ds_config)
data = torch.randint(0, 256, (8, 128), device=engine.device)
for step in range(20):
    loss = engine(input_ids=data, labels=data).loss
    engine.backward(loss)
    engine.step()
out = {"loss": loss.item(), "peak_mib": torch.cuda.max_memory_allocated() >> 20,
       "import_s": imported - start, "wall_s": time.time() - start,
       "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
       "MASTER_PORT": os.environ["MASTER_PORT"]}
with open(os.path.join(os.environ.get("ORCHESTRATE_OUTPUT_DIR", "."), "ds.json"), "w") as f:
    json.dump(out, f)
print(json.dumps(out))
