"""PyTorch Lightning on a tiny byte-level transformer as an orchestrate stage. The one
orchestrate line is `callbacks=[..., OrchestrateCallback()]`; `last_checkpoint()` makes a
stopped stage's next attempt continue from the checkpoint the callback saved. See plan.toml.

    python3 train.py [--steps N]            # also runs on its own, outside orchestrate
"""
import argparse

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

import orchestrate_stage as stage
from orchestrate_stage.lightning import OrchestrateCallback, last_checkpoint
from litlm import ByteLM, ByteText


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seq", type=int, default=64)
    args = p.parse_args()

    L.seed_everything(0, verbose=False)
    out = stage.output_dir()
    train = DataLoader(ByteText(4096, args.seq, seed=0), batch_size=16, shuffle=True)
    val = DataLoader(ByteText(64, args.seq, seed=1), batch_size=64)
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="auto",
        devices=1,
        precision="bf16-mixed" if torch.cuda.is_available() else "32-true",
        default_root_dir=str(out),
        val_check_interval=50,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=str(out), every_n_train_steps=50), OrchestrateCallback()],
    )
    trainer.fit(ByteLM(seq_len=args.seq), train, val, ckpt_path=last_checkpoint())
    # What downstream stages receive.
    trainer.save_checkpoint(out / "model.ckpt")
    stage.checkpoint(out / "model.ckpt", step=trainer.global_step)


if __name__ == "__main__":
    main()
