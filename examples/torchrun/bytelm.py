"""What train_ddp.py and eval_model.py share: a tiny byte-level language model in plain
PyTorch and synthetic text (nothing is downloaded)."""
import random

import torch
from torch import nn

WORDS = "cat dog frog bird fish duck red blue green old small big sees likes finds hears".split()


def batch(rng, size, seq_len):
    """`size` sequences of `seq_len` bytes of generated sentences."""
    rows = []
    for _ in range(size):
        text = ""
        while len(text) < seq_len:
            text += " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) + ". "
        rows.append(list(text.encode()[:seq_len]))
    return torch.tensor(rows)


class ByteLM(nn.Module):
    """Predicts the next byte from the previous `context` bytes (an MLP over their embeddings)."""

    def __init__(self, context=8, d=32, hidden=256):
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(256, d)
        self.mlp = nn.Sequential(nn.Linear(context * d, hidden), nn.GELU(), nn.Linear(hidden, 256))

    def forward(self, x):
        """Mean next-byte cross-entropy over a batch of byte sequences."""
        windows = x.unfold(1, self.context + 1, 1)  # (batch, positions, context + 1)
        inputs, targets = windows[..., :-1], windows[..., -1]
        logits = self.mlp(self.embed(inputs).flatten(-2))
        return nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
