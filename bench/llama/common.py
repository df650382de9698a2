"""What both sides of bench/llama share: the model directory (config, random weights,
tokenizer, data) and the worker's batch sampler, reproduced exactly so that PyTorch trains on
the very batches stage-worker draws (stage-worker/src/stages/llama/data.rs and
stage-worker/src/data/rng.rs)."""
import json, os, random

MASK = (1 << 64) - 1

# name: LlamaConfig fields. "1b" is TinyLlama's 1.1B shape (GQA 32/4 heads, untied head).
SHAPES = {
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
}
EOS = 2


class Rng:
    """SplitMix64, as the worker's `Rng`."""

    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return (self.next() * n) >> 64

    @staticmethod
    def for_stream(seed, stream):
        a = Rng(seed ^ 0x5851F42D4C957F2D).next()
        return Rng(a ^ ((stream * 0x9E3779B97F4A7C15) & MASK))


def batch(stream, seed, step, rows, seq):
    """The worker's training batch `step` of a text stream: (inputs, targets), lists of rows."""
    rng = Rng.for_stream(seed, step)
    xs, ys = [], []
    for _ in range(rows):
        s = rng.below(len(stream) - seq)
        xs.append(stream[s:s + seq])
        ys.append(stream[s + 1:s + seq + 1])
    return xs, ys


def token_stream(model_dir, data):
    """The worker's token stream of a {"text"} JSONL file: each document's ids, then EOS."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    out = []
    with open(data) as f:
        for line in f:
            if line.strip():
                out.extend(tok.encode(json.loads(line)["text"], add_special_tokens=True).ids)
                out.append(EOS)
    return out


def make_model_dir(shape, out, data, device, tokens=1_000_000, seed=0):
    """A randomly initialised LlamaForCausalLM of `shape` saved in `out` (fp32 safetensors), a
    word-level tokenizer with one token per vocabulary entry, and `data`: documents drawn from a
    first-order Markov chain over the vocabulary (4 successors per token), so the loss has
    somewhere to go (from ln(vocab) towards ln 4)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = SHAPES[shape]
    v = cfg["vocab_size"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"t{i}": i for i in range(3, v)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    config = LlamaConfig(**cfg, max_position_embeddings=2048, rope_theta=10000.0,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=EOS)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    r = random.Random(seed)
    succ = [[r.randrange(3, v) for _ in range(4)] for _ in range(v)]
    with open(data, "w") as f:
        cur, left = 3, tokens
        while left > 0:
            n = min(512, left)
            words = []
            for _ in range(n):
                cur = succ[cur][r.randrange(4)]
                words.append(f"t{cur}")
            f.write(json.dumps({"text": " ".join(words)}) + "\n")
            left -= n
    return sum(p.numel() for p in model.parameters())
