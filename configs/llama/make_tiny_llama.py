#!/usr/bin/env python3
"""Builds a tiny Llama model in Hugging Face format, locally (nothing is downloaded): a
byte-level BPE tokenizer trained on the given text files, and a randomly initialised
`LlamaForCausalLM` whose vocabulary is that tokenizer's, saved with `save_pretrained`
(config.json, model.safetensors, tokenizer.json and the tokenizer's config).

  make_tiny_llama.py --out DIR [--corpus FILE.jsonl ...] [--hidden 64] [--layers 2]
                     [--heads 4] [--kv-heads 2] [--vocab 512] [--tied] [--seed 0]
                     [--init-std 0.02] [--rope-theta 10000] [--max-positions 256]

The corpus files are JSONL with "text" or "prompt"/"completion" fields (or plain text).
Without --corpus the tokenizer is trained on a few built-in sentences.
"""
import argparse, json, os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>"]


def corpus_lines(paths):
    if not paths:
        yield from ["the quick brown fox jumps over the lazy dog", "upper: cat\n", "CAT\n"] * 20
        return
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not path.endswith(".jsonl"):
                    yield line
                    continue
                if line.strip():
                    row = json.loads(line)
                    yield from (row[k] for k in ("text", "prompt", "completion") if k in row)


def tokenizer(paths, vocab):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus_lines(paths), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--corpus", nargs="*", default=[])
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=0, help="default: 8/3 of --hidden")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--max-positions", type=int, default=256)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init-std", type=float, default=0.02, help="initializer_range")
    a = p.parse_args()
    tok = tokenizer(a.corpus, a.vocab)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=a.hidden,
        intermediate_size=a.intermediate or (a.hidden * 8 // 3 + 7) // 8 * 8,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
        max_position_embeddings=a.max_positions, rope_theta=a.rope_theta,
        tie_word_embeddings=a.tied, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        initializer_range=a.init_std)
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(config)
    os.makedirs(a.out, exist_ok=True)
    model.save_pretrained(a.out)
    tok.save_pretrained(a.out)
    n = sum(t.numel() for t in model.parameters())
    print(f"tiny Llama: {n} parameters, vocabulary {len(tok)}, in {a.out}", flush=True)


if __name__ == "__main__":
    main()
