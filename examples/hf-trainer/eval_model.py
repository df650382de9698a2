"""Loads the model the train stage handed down and measures its loss on held-out text; writes
eval.json (the loss, and the SHA-256 of the weights it loaded, so a reader can check that it
evaluated exactly the checkpoint orchestrate recorded)."""
import hashlib
import json
import math

import torch
from transformers import LlamaForCausalLM

import orchestrate_stage as stage
from toydata import ByteText


def main():
    model_dir = stage.input_dir("train")
    weights = model_dir / "model.safetensors"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = LlamaForCausalLM.from_pretrained(model_dir).to(device).eval()
    data = ByteText(64, model.config.max_position_embeddings, seed=1)
    with torch.no_grad():
        batch = torch.stack([row["input_ids"] for row in data]).to(device)
        loss = model(input_ids=batch, labels=batch).loss.item()
    result = {
        "eval_loss": loss,
        "perplexity": math.exp(loss),
        "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
    }
    (stage.output_dir() / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
    stage.metrics(eval_loss=loss, perplexity=result["perplexity"])


if __name__ == "__main__":
    main()
