#!/usr/bin/env python3
"""The transformers side of stage-worker's Llama tests.

  llama_check.py compare MODEL_DIR IDS WORKER_LOGITS
      loads MODEL_DIR with AutoModelForCausalLM.from_pretrained (fp32, CPU), computes its
      logits for IDS (rows separated by ';', ids by ','), and compares them with the
      `logits` tensor of WORKER_LOGITS (what `stage-worker llama-logits` wrote); prints
      {"max_abs_diff": ..., "max_abs_logit": ...} and exits 1 when the difference exceeds 1e-3.
"""
import json, sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def compare(model_dir, ids, worker_file):
    rows = [[int(x) for x in r.split(",")] for r in ids.split(";")]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        theirs = model(torch.tensor(rows)).logits.float()
    ours = load_file(worker_file)["logits"]
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    diff = (ours - theirs).abs().max().item()
    print(json.dumps({"max_abs_diff": diff, "max_abs_logit": theirs.abs().max().item(),
                      "shape": list(theirs.shape)}))
    return 0 if diff <= 1e-3 else 1


if __name__ == "__main__":
    if sys.argv[1] == "compare":
        sys.exit(compare(*sys.argv[2:5]))
    sys.exit(f"unknown command {sys.argv[1]}")
