"""PyTorch Lightning as an orchestrate stage: one callback, one line in your code.

    from orchestrate_stage.lightning import OrchestrateCallback, last_checkpoint

    trainer = L.Trainer(max_steps=1000, callbacks=[OrchestrateCallback()])
    trainer.fit(model, data, ckpt_path=last_checkpoint())    # None on a first attempt

What the callback does (rank 0 reports; every rank stops):

- `on_train_batch_end`: a `progress` event (global step, `max_steps` or the estimated
  stepping batches, the batch's loss) at most every `progress_every_s` seconds.
- At the end of each training epoch and validation run, and at the end of `fit`: the
  trainer's `callback_metrics` (what the module `self.log`s) as `metrics`, with
  `global_step` (and `resumed_from_step` when `fit` continued a checkpoint).
- Checkpoints: every file a `ModelCheckpoint` wrote (its best and last) is hashed and
  reported as a `checkpoint` event, as is the stop checkpoint below.
- SIGTERM (orchestrate stopping the stage: Ctrl-C or SIGTERM to the run, a timeout, a Slurm
  preemption): from `setup` on, the signal no longer kills the process (Lightning's own
  SIGTERM handler, which it installs at `fit`, still runs). At the end of the current batch
  the callback saves `interrupted.ckpt` in the output directory with
  `trainer.save_checkpoint` (weights, optimizer, loop state: `fit(ckpt_path=...)` continues
  from it) and sets `trainer.should_stop`; the `SIGTERMException` Lightning then raises exits
  the process with 75 (`EXIT_INTERRUPTED`) instead of 0. The next attempt gets the output
  directory back as `resume_dir()`, and `last_checkpoint()` names the newest `.ckpt` there.
  Under several processes the ranks agree on the stop at every batch end (one all-reduce).

Needs `lightning` (imported here, not by `orchestrate_stage`).
"""

import math
import os
import time
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException

import orchestrate_stage as ostage

#: File name of the checkpoint saved when the stage is asked to stop.
STOP_CHECKPOINT = "interrupted.ckpt"


def last_checkpoint(directory=None):
    """The newest (latest modified) `*.ckpt` file in `directory`, as a string for
    `trainer.fit(..., ckpt_path=...)`. `directory` defaults to the stage's `resume_dir()`, so
    on a first attempt (nothing to resume) the answer is None. Files still being written by
    this callback (`*.ckpt.partial`) are not candidates."""
    if directory is None:
        directory = ostage.resume_dir()
        if directory is None:
            return None
    directory = Path(directory)
    if not directory.is_dir():
        return None
    found = [(p.stat().st_mtime_ns, p) for p in directory.glob("*.ckpt") if p.is_file()]
    return str(max(found)[1]) if found else None


def _numbers(values):
    """The finite scalar entries of `callback_metrics` (tensors or numbers), as floats."""
    out = {}
    for key, value in (values or {}).items():
        try:
            number = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            continue
        if math.isfinite(number):
            out[key] = number
    return out


class OrchestrateCallback(pl.Callback):
    """Reports a Lightning `fit`'s progress, metrics and checkpoints to orchestrate, and turns
    SIGTERM into a saved `interrupted.ckpt` and exit status 75 (see the module's
    documentation). Outside orchestrate it reports nothing; the stop still saves."""

    def __init__(self, progress_every_s=1.0, checkpoint_dir=None, exit_on_stop=True):
        """`progress_every_s`: the least time between two progress events. `checkpoint_dir`:
        where the stop checkpoint goes (default: the stage's output directory).
        `exit_on_stop`: exit with 75 after a stop (else `fit` ends early and `self.stopped`
        is True)."""
        self.progress_every_s = progress_every_s
        self.checkpoint_dir = checkpoint_dir
        self.exit_on_stop = exit_on_stop
        self.stopped = False
        self._saved_stop = False
        self._resumed_from = None
        self._last_progress = 0.0
        self._reported = {}

    # -- lifecycle -------------------------------------------------------------------------

    def setup(self, trainer, pl_module, stage):
        if stage == "fit":
            ostage.watch_stop()

    def teardown(self, trainer, pl_module, stage):
        if stage == "fit":
            ostage.unwatch_stop()

    def on_train_start(self, trainer, pl_module):
        self._resumed_from = trainer.global_step or None
        if trainer.is_global_zero:
            ostage.started(device=str(pl_module.device))
        self._last_progress = time.monotonic()

    # -- reporting -------------------------------------------------------------------------

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.is_global_zero and time.monotonic() - self._last_progress >= self.progress_every_s:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            self._progress(trainer, None if loss is None else float(loss))
        if self._stop_agreed(trainer):
            self._save_stop_checkpoint(trainer)
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module):
        self._report_metrics(trainer)

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._report_metrics(trainer)

    def on_fit_end(self, trainer, pl_module):
        self._report_metrics(trainer)
        self._report_model_checkpoints(trainer)
        if self.stopped and self.exit_on_stop:
            # Training stopped without Lightning's own SIGTERMException (the stop came
            # through `ostage.request_stop()`, or at the last batch): end the same way.
            raise SIGTERMException(ostage.EXIT_INTERRUPTED)

    def on_exception(self, trainer, pl_module, exception):
        if not isinstance(exception, SIGTERMException):
            return
        # Lightning raises SIGTERMException at the start of a batch on every rank at once
        # (several processes) or after our batch end (one process): save if not saved yet.
        self._save_stop_checkpoint(trainer)
        if self.exit_on_stop and isinstance(exception, SystemExit):
            exception.code = ostage.EXIT_INTERRUPTED
            if trainer.is_global_zero:
                ostage.failed(f"stopped by SIGTERM at step {trainer.global_step}, saved {STOP_CHECKPOINT}",
                             reason="interrupted")

    # -- helpers ---------------------------------------------------------------------------

    def _progress(self, trainer, loss=None):
        self._last_progress = time.monotonic()
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        if total is None:
            estimated = trainer.estimated_stepping_batches
            total = int(estimated) if math.isfinite(estimated) else None
        ostage.progress(trainer.global_step, total_steps=total, loss=loss)

    def _report_metrics(self, trainer):
        if not trainer.is_global_zero:
            return
        numbers = _numbers(trainer.callback_metrics)
        numbers["global_step"] = float(trainer.global_step)
        if self._resumed_from:
            numbers["resumed_from_step"] = float(self._resumed_from)
        ostage.metrics(**numbers)
        self._report_model_checkpoints(trainer)

    def _report_model_checkpoints(self, trainer):
        """Reports the files `ModelCheckpoint` callbacks have written since the last call."""
        if not trainer.is_global_zero:
            return
        for callback in trainer.checkpoint_callbacks:
            for path in {getattr(callback, "best_model_path", ""), getattr(callback, "last_model_path", "")}:
                if path:
                    self._report_file(Path(path), trainer.global_step)

    def _report_file(self, path, step):
        try:
            real = path.resolve()
            mtime = real.stat().st_mtime_ns
        except OSError:
            return
        if self._reported.get(real) == mtime:
            return
        self._reported[real] = mtime
        ostage.checkpoint(real, step=step)

    def _stop_agreed(self, trainer):
        stop = ostage.stop_requested()
        if trainer.world_size > 1:
            stop = trainer.strategy.reduce_boolean_decision(stop, all=False)
        return stop

    def _save_stop_checkpoint(self, trainer):
        """Saves the resumable stop checkpoint once: every rank calls `save_checkpoint` (it
        is collective), rank 0 renames the finished file into place and reports it."""
        self.stopped = True
        if self._saved_stop:
            return
        self._saved_stop = True
        directory = Path(self.checkpoint_dir) if self.checkpoint_dir else ostage.output_dir()
        final = directory / STOP_CHECKPOINT
        partial = directory / (STOP_CHECKPOINT + ".partial")
        trainer.save_checkpoint(partial)
        if trainer.is_global_zero:
            os.replace(partial, final)
            self._report_file(final, trainer.global_step)
