"""Hugging Face Trainer on a tiny Llama (built from a LlamaConfig: nothing is downloaded),
trained on byte-level synthetic text, as an orchestrate stage. The one orchestrate line is
`callbacks=[OrchestrateCallback()]`; `last_checkpoint()` makes a stopped stage's next attempt
continue from the checkpoint the callback had Trainer save. See plan.toml beside it.

    python3 train.py [--steps N]            # also runs on its own, outside orchestrate
"""
import argparse

import torch
from transformers import LlamaForCausalLM, Trainer, TrainingArguments

import orchestrate_stage as stage
from orchestrate_stage.hf import OrchestrateCallback, last_checkpoint
from toydata import ByteText, tiny_llama_config


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--save-steps", type=int, default=40)
    args = p.parse_args()

    torch.manual_seed(0)
    out = stage.output_dir()
    model = LlamaForCausalLM(tiny_llama_config(args.seq))
    gpu = torch.cuda.is_available()
    training = TrainingArguments(
        output_dir=str(out),
        max_steps=args.steps,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=10,
        lr_scheduler_type="cosine",
        logging_steps=5,
        save_steps=args.save_steps,
        save_total_limit=2,
        bf16=gpu and torch.cuda.is_bf16_supported(),
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(model=model, args=training, train_dataset=ByteText(4096, args.seq, seed=0),
                      callbacks=[OrchestrateCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint())
    # What downstream stages receive: the final weights and config at the top of the output.
    trainer.save_model(str(out))
    stage.checkpoint(out / "model.safetensors", step=trainer.state.global_step)


if __name__ == "__main__":
    main()
