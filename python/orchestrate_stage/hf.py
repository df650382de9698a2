"""Hugging Face `Trainer` as an orchestrate stage: one callback, one line in your code.

    from orchestrate_stage.hf import OrchestrateCallback, last_checkpoint

    args = TrainingArguments(output_dir=str(stage.output_dir()), save_steps=50, logging_steps=10, ...)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[OrchestrateCallback()])
    trainer.train(resume_from_checkpoint=last_checkpoint())   # None on a first attempt

What the callback does, on the main process only (rank 0 reports; every rank stops):

- `on_log`: a `progress` event (global step, `max_steps`, the last logged loss) and every
  numeric value of the log (`loss`, `learning_rate`, `grad_norm`, `epoch`, and at the end
  `train_loss`, `train_runtime`, ...) as `metrics`, so the last of each lands in report.json.
  Between logs, a `progress` event at most every `progress_every_s` seconds.
- `on_evaluate`: the evaluation's metrics (`eval_loss`, ...).
- `on_save`: every file of the `checkpoint-N` directory Trainer just wrote, hashed and
  reported as `checkpoint` events (step N).
- `on_train_end`: `global_step`, and `resumed_from_step` when the run continued a checkpoint.
- SIGTERM (orchestrate stopping the stage: Ctrl-C or SIGTERM to the run, a timeout, a Slurm
  preemption): from `on_train_begin` on, the signal no longer kills the process. At the next
  optimizer step the callback sets `control.should_save` and `control.should_training_stop`,
  so Trainer writes a complete `checkpoint-N` (weights, optimizer, scheduler, RNG, trainer
  state) and leaves its loop; then the process exits with 75 (`EXIT_INTERRUPTED`) from
  `on_train_end`, before the code after `trainer.train()` would save a "final" model that is
  not. The next attempt gets the output directory back as `resume_dir()`, and
  `last_checkpoint()` names that `checkpoint-N`. Under several processes (torchrun,
  accelerate) the ranks agree on the stop with one all-reduce per optimizer step, so every
  rank saves at the same step.

Needs `transformers` (imported here, not by `orchestrate_stage`).
"""

import math
import re
import time
from pathlib import Path

import orchestrate_stage as stage
from transformers import TrainerCallback

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def last_checkpoint(directory=None):
    """The newest complete Trainer checkpoint (`checkpoint-N` with the highest N whose
    `trainer_state.json`, written last, exists) in `directory`, as a string for
    `trainer.train(resume_from_checkpoint=...)`. `directory` defaults to the stage's
    `resume_dir()`, so on a first attempt (nothing to resume) the answer is None."""
    if directory is None:
        directory = stage.resume_dir()
        if directory is None:
            return None
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = []
    for entry in directory.iterdir():
        match = _CHECKPOINT.match(entry.name)
        if match and (entry / "trainer_state.json").is_file():
            found.append((int(match.group(1)), entry))
    return str(max(found)[1]) if found else None


def _numbers(values):
    """The finite numeric entries of a log or metrics dict, as floats."""
    out = {}
    for key, value in (values or {}).items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class OrchestrateCallback(TrainerCallback):
    """Reports a Trainer's progress, metrics and checkpoints to orchestrate, and turns SIGTERM
    into a saved checkpoint and exit status 75 (see the module's documentation). Outside
    orchestrate it reports nothing; SIGTERM still ends training with a checkpoint."""

    def __init__(self, progress_every_s=1.0, report_checkpoints=True, exit_on_stop=True):
        """`progress_every_s`: the least time between two progress events outside `on_log`.
        `report_checkpoints`: hash and report each `checkpoint-N` Trainer saves (reading it
        once more; turn off for very large checkpoints, orchestrate then hashes only the
        declared outputs). `exit_on_stop`: exit with 75 after a stop's checkpoint (else
        `trainer.train()` returns and `self.stopped` is True)."""
        self.progress_every_s = progress_every_s
        self.report_checkpoints = report_checkpoints
        self.exit_on_stop = exit_on_stop
        self.stopped = False
        self._resumed_from = None
        self._last_progress = 0.0
        self._loss = None

    def on_train_begin(self, args, state, control, **kwargs):
        stage.watch_stop()
        self._resumed_from = state.global_step or None
        if state.is_world_process_zero:
            stage.started(device=str(args.device))
        self._last_progress = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if self._stop_agreed(args):
            self.stopped = True
            control.should_save = True
            control.should_training_stop = True
        if state.is_world_process_zero and time.monotonic() - self._last_progress >= self.progress_every_s:
            self._progress(state)
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero:
            return
        numbers = _numbers(logs)
        if "loss" in numbers:
            self._loss = numbers["loss"]
        self._progress(state)
        if numbers:
            stage.metrics(**numbers)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if state.is_world_process_zero and metrics:
            stage.metrics(**_numbers(metrics))

    def on_save(self, args, state, control, **kwargs):
        if not (state.is_world_process_zero and self.report_checkpoints):
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if folder.is_dir():
            stage.checkpoint_dir(folder, step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        zero = state.is_world_process_zero
        if zero:
            self._progress(state)
            final = {"global_step": state.global_step}
            if self._resumed_from:
                final["resumed_from_step"] = self._resumed_from
            stage.metrics(**final)
        stage.unwatch_stop()
        if self.stopped and self.exit_on_stop:
            message = f"stopped by SIGTERM at step {state.global_step}, saved checkpoint-{state.global_step}"
            if zero:
                stage.exit_interrupted(message)
            raise SystemExit(stage.EXIT_INTERRUPTED)

    def _progress(self, state):
        self._last_progress = time.monotonic()
        stage.progress(state.global_step, total_steps=state.max_steps or None, loss=self._loss)

    def _stop_agreed(self, args):
        """Whether any rank was asked to stop: every rank gets the same answer, so they all
        save the same step (a rank saving alone would wait forever for the others)."""
        stop = stage.stop_requested()
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            import torch

            flag = torch.tensor([1 if stop else 0], device=args.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop
