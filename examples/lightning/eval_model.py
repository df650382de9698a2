"""Loads the model the train stage handed down and measures its loss on held-out text; writes
eval.json (the loss, the step the checkpoint holds, and the SHA-256 of the file it loaded, so a
reader can check that it evaluated exactly the checkpoint orchestrate recorded)."""
import hashlib
import json
import math

import torch

import orchestrate_stage as stage
from litlm import ByteLM, ByteText


def main():
    path = stage.input_dir("train") / "model.ckpt"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = ByteLM.load_from_checkpoint(path, map_location=device).eval()
    step = torch.load(path, map_location="cpu", weights_only=False)["global_step"]
    data = ByteText(64, model.hparams.seq_len, seed=2)
    with torch.no_grad():
        loss = model.loss(torch.stack([data[i] for i in range(len(data))]).to(device)).item()
    result = {
        "eval_loss": loss,
        "perplexity": math.exp(loss),
        "global_step": step,
        "checkpoint_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    (stage.output_dir() / "eval.json").write_text(json.dumps(result, indent=1) + "\n")
    stage.metrics(eval_loss=loss, perplexity=result["perplexity"])


if __name__ == "__main__":
    main()
