#!/usr/bin/env python3
"""Writes the Llama quickstart's data (configs/data/llama/, committed; rerun to regenerate the
same files): pretrain.jsonl, simple English-like sentences as {"text": ...} lines; sft.jsonl and
sft-eval.jsonl, the `upper:` task as {"prompt": ..., "completion": ...} lines, the held-out
phrases never among the training ones.

  make_data.py [OUT_DIR]
"""
import json, os, random, sys

ADJ = "small big red green blue old young fast slow happy quiet brave".split()
NOUN = "cat dog fox bird frog goat duck fish bear lamb horse mouse".split()
VERB = "sees meets hears chases follows finds likes helps".split()
PLACE = "near the river|in the garden|on the hill|by the road|under the tree".split("|")


def sentence(r):
    a, b = f"the {r.choice(ADJ)} {r.choice(NOUN)}", f"the {r.choice(ADJ)} {r.choice(NOUN)}"
    s = f"{a} {r.choice(VERB)} {b} {r.choice(PLACE)}."
    return s[0].upper() + s[1:]


def phrase(r):
    return " ".join(r.choice(ADJ + NOUN + VERB) for _ in range(r.randint(1, 4)))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "llama")
    os.makedirs(out, exist_ok=True)
    r = random.Random(7)
    with open(os.path.join(out, "pretrain.jsonl"), "w") as f:
        for _ in range(1500):
            doc = " ".join(sentence(r) for _ in range(r.randint(1, 3)))
            f.write(json.dumps({"text": doc}) + "\n")
    phrases = sorted({phrase(r) for _ in range(4000)})
    r.shuffle(phrases)
    held_out, train = phrases[:200], phrases[200:]
    for name, rows in (("sft.jsonl", train), ("sft-eval.jsonl", held_out)):
        with open(os.path.join(out, name), "w") as f:
            for p in rows:
                f.write(json.dumps({"prompt": f"upper: {p}\n", "completion": p.upper() + "\n"}) + "\n")


if __name__ == "__main__":
    main()
