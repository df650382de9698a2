"""Loads the model the DDP stage handed down and measures its loss on held-out text; writes
eval.json (the loss, the step the checkpoint holds, the SHA-256 of the file it loaded)."""
import hashlib
import json
import random

import torch

import orchestrate_stage as stage
from bytelm import ByteLM, batch

device = "cuda" if torch.cuda.is_available() else "cpu"
path = stage.input_dir("train") / "model.pt"
state = torch.load(path, map_location=device)
model = ByteLM().to(device)
model.load_state_dict(state["model"])
with torch.no_grad():
    loss = model(batch(random.Random(10**6), 64, 64).to(device)).item()
result = {"eval_loss": loss, "step": state["step"],
          "checkpoint_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
(stage.output_dir() / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
stage.metrics(eval_loss=loss)
