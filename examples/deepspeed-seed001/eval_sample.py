"""Seed 001's evaluate step as one orchestrate stage: loads the fine-tuned weights the
finetune stage handed down (plain transformers, no DeepSpeed) and evaluates them on the same
dataset sample; writes eval.json and reports loss and accuracy."""
import argparse
import json

import torch
from transformers import LlamaForCausalLM

import orchestrate_stage as stage
from seed001 import evaluate, load_pairs


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sample", required=True)
    p.add_argument("--model", required=True, help="the finetune stage's output directory")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = LlamaForCausalLM.from_pretrained(args.model, dtype=dtype).to(device)
    stage.started(device=device)
    result = evaluate(model, load_pairs(args.sample), device, model.config.max_position_embeddings)
    (stage.output_dir() / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
    stage.metrics(**result)


if __name__ == "__main__":
    main()
