"""What train.py and eval_model.py share: a tiny causal transformer over bytes as a
LightningModule, and synthetic byte-level text (nothing is downloaded)."""
import random

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import Dataset

WORDS = "cat dog frog bird fish duck red blue green old small big sees likes finds hears".split()


class ByteText(Dataset):
    """`size` sequences of `seq_len` bytes of generated sentences; the same `seed`, the same
    data."""

    def __init__(self, size, seq_len, seed):
        rng = random.Random(seed)
        self.rows = []
        for _ in range(size):
            text = ""
            while len(text) < seq_len:
                text += " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) + ". "
            self.rows.append(torch.tensor(list(text.encode()[:seq_len])))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return self.rows[i]


class ByteLM(L.LightningModule):
    """A decoder-only transformer language model over bytes (vocabulary 256)."""

    def __init__(self, d_model=64, n_layers=2, n_heads=4, seq_len=64, lr=3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(256, d_model)
        self.pos = nn.Parameter(torch.zeros(seq_len, d_model))
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layers)
        self.head = nn.Linear(d_model, 256)

    def loss(self, x):
        """Mean next-byte cross-entropy of a batch of byte sequences."""
        inputs, targets = x[:, :-1], x[:, 1:]
        n = inputs.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=x.device)
        h = self.blocks(self.embed(inputs) + self.pos[:n], mask=mask, is_causal=True)
        return nn.functional.cross_entropy(self.head(h).reshape(-1, 256), targets.reshape(-1))

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
