"""A tiny CPU stage of a Python pipeline: torch and transformers' Llama classes imported (a
zygote that preloads them has them already), a small tensor sum, a file. It writes
`phases.json` beside its output (its first line, imports done, last line; Unix seconds) for
bench/sharing/phases.py, which adds the report's spawn, exit and verdict moments."""
import time

first_line = time.time()
import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: F401

import orchestrate_stage as stage

imported = time.time()
total = float(torch.ones(1 << 16).sum())
(stage.output_dir() / "sum.txt").write_text(f"{total}\n")
moments = dict(first_line=first_line, imported=imported, last_line=time.time())
(stage.output_dir() / "phases.json").write_text(json.dumps(moments))
