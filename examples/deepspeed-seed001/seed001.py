"""What finetune.py, eval_sample.py and one_process.py share: the Llama built from a config
(nothing is downloaded), one dataset sample as byte-level batches, the DeepSpeed ZeRO-2
config, and the evaluation."""
import json
import os
import random

import torch

#: Seed 001's 1.1B Llama-architecture model (TinyLlama's shape), and a small one for a quick run.
SIZES = {
    "small": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4),
    "1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                 num_key_value_heads=4),
}


def build_model(size, seq_len):
    """A freshly initialised LlamaForCausalLM over bytes (vocabulary 256), same seed each time."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, max_position_embeddings=seq_len, bos_token_id=10, eos_token_id=10,
                         pad_token_id=0, **SIZES[size])
    return LlamaForCausalLM(config)


def load_pairs(path):
    """The (prompt, completion) pairs of a JSONL sample file."""
    with open(path, encoding="utf-8") as f:
        return [(r["prompt"], r["completion"]) for r in map(json.loads, f) if r]


def batch(pairs, rng, size, seq_len):
    """`size` rows of `seq_len` bytes: prompt+completion pairs drawn from `pairs`, concatenated."""
    rows = []
    for _ in range(size):
        text = ""
        while len(text) < seq_len:
            prompt, completion = rng.choice(pairs)
            text += prompt + completion
        rows.append(list(text.encode()[:seq_len]))
    return torch.tensor(rows)


def deepspeed_config(micro_batch, lr, bf16):
    """ZeRO stage 2 with PyTorch's AdamW (`torch_adam`: no fused-Adam build needed)."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": 2},
        "bf16": {"enabled": bf16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def single_process_env():
    """The variables torch.distributed's env:// rendezvous reads, for a run without a launcher
    (plain `python`): one rank. A launcher's (torchrun, deepspeed) and orchestrate's
    MASTER_PORT are kept."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


@torch.no_grad()
def evaluate(model, pairs, device, seq_len, batches=4, batch_size=8):
    """Mean next-byte loss on the sample (held-out draws), and the exact-match accuracy of
    greedy completions of its first prompts."""
    model.eval()
    rng = random.Random(12345)
    losses = []
    for _ in range(batches):
        x = batch(pairs, rng, batch_size, seq_len).to(device)
        losses.append(model(input_ids=x, labels=x).loss.float().item())
    correct = 0
    probes = pairs[:16]
    for prompt, completion in probes:
        ids = torch.tensor([list(prompt.encode())], device=device)
        out = model.generate(ids, max_new_tokens=len(completion.encode()), do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        correct += bytes(out[0, ids.shape[1]:].tolist()) == completion.encode()
    model.train()
    return {"loss": sum(losses) / len(losses), "accuracy": correct / len(probes)}
