"""What train.py and eval_model.py share: the synthetic byte-level text (no tokenizer, nothing
downloaded) and the tiny Llama's shape."""
import random

import torch
from torch.utils.data import Dataset

WORDS = "cat dog frog bird fish duck red blue green old small big sees likes finds hears".split()


def sentence(rng):
    """One sentence of the toy language: a subject, a verb and an object."""
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 6))) + ". "


class ByteText(Dataset):
    """`size` sequences of `seq_len` bytes of generated sentences, as causal-LM examples
    (`labels` are the inputs: the model shifts them). The same `seed` gives the same data."""

    def __init__(self, size, seq_len, seed):
        rng = random.Random(seed)
        self.rows = []
        for _ in range(size):
            text = ""
            while len(text) < seq_len:
                text += sentence(rng)
            self.rows.append(torch.tensor(list(text.encode()[:seq_len])))

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


def tiny_llama_config(seq_len):
    """A Llama small enough to train on a CPU in seconds: vocabulary 256 (bytes)."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq_len,
                       bos_token_id=10, eos_token_id=10, pad_token_id=0)
