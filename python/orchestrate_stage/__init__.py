"""Helpers for a Python program that runs as an `orchestrate` stage. Standard library only.

Install the package (`pip install ./python`), or, without installing, copy this file next to
your script as `orchestrate_stage.py` or put the `python/` directory on PYTHONPATH: the core
below needs nothing else. The optional submodules `orchestrate_stage.hf` (a Hugging Face
`TrainerCallback`) and `orchestrate_stage.lightning` (a Lightning `Callback`) import their
framework when imported themselves, never before.

    import orchestrate_stage as stage

    out = stage.output_dir()              # where to write what downstream stages receive
    base = stage.input_dir("pretrain")    # an upstream stage's output directory
    resume = stage.resume_dir()           # an earlier attempt's files, or None
    stage.watch_stop()                    # SIGTERM now only sets stage.stop_requested()
    for step in range(steps):
        ...
        stage.progress(step + 1, total_steps=steps, loss=loss, tokens_per_s=rate)
        if stage.stop_requested():        # orchestrate is stopping the stage (preemption, timeout)
            save_resumable_checkpoint()
            stage.exit_interrupted()       # exit 75: stopped, resumable
    stage.released()                      # optional: no CUDA context left, the GPU may go on
    stage.checkpoint(out / "model.pt", step=steps)   # hashes the file, reports it
    stage.metrics(loss=final_loss, accuracy=acc)

Run outside `orchestrate` (no ORCHESTRATE_EVENTS), reporting does nothing and the paths fall
back to the current directory, so the same script also runs on its own. Call the reporting
functions from any process of the stage (under torchrun/accelerate, typically rank 0 only).
The wire format is docs/worker-contract.md: one JSON object per line on a Unix socket.
"""

import hashlib
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

PROTOCOL_VERSION = 1

#: Exit status of a stage that stopped on request (SIGTERM) after saving a checkpoint its next
#: attempt resumes from: the built-in worker's code, EX_TEMPFAIL in sysexits.h.
EXIT_INTERRUPTED = 75

_sock = None


def _send(event, **fields):
    global _sock
    path = os.environ.get("ORCHESTRATE_EVENTS")
    if not path:
        return
    line = (json.dumps({"v": PROTOCOL_VERSION, "event": event, **fields}) + "\n").encode()
    for _ in range(2):  # reconnect once if the connection was lost (e.g. after a fork)
        try:
            if _sock is None:
                _sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                _sock.connect(path)
            _sock.sendall(line)
            return
        except OSError:
            _sock = None


def stage_name():
    """The stage's name (ORCHESTRATE_STAGE), or None outside orchestrate."""
    return os.environ.get("ORCHESTRATE_STAGE")


def output_dir():
    """The directory to write outputs to (ORCHESTRATE_OUTPUT_DIR; the current directory
    outside orchestrate)."""
    return Path(os.environ.get("ORCHESTRATE_OUTPUT_DIR", "."))


def inputs():
    """Every upstream stage's output directory, by stage name (from ORCHESTRATE_INPUTS_FILE,
    which is always set; a stage with more than 64 inputs gets no per-input variables)."""
    path = os.environ.get("ORCHESTRATE_INPUTS_FILE")
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        return {name: Path(d) for name, d in json.load(f).items()}


def input_dir(stage):
    """Upstream stage `stage`'s output directory: its exact name in the inputs file
    (ORCHESTRATE_INPUTS_FILE), else ORCHESTRATE_INPUT_<STAGE>. `orchestrate validate` refuses
    two stages whose names map to one variable (`a-b`, `a_b`), so either way it is `stage`'s."""
    found = inputs().get(stage)
    if found is not None:
        return found
    var = "ORCHESTRATE_INPUT_" + "".join(c.upper() if c.isalnum() and c.isascii() else "_" for c in stage)
    value = os.environ.get(var)
    if value is None:
        raise KeyError(f"{var} is not set: is `{stage}` in this stage's `after` list?")
    return Path(value)


def resume_dir():
    """The output directory when it holds an earlier attempt's files (ORCHESTRATE_RESUME_DIR),
    else None."""
    value = os.environ.get("ORCHESTRATE_RESUME_DIR")
    return Path(value) if value else None


def attempt():
    """Which attempt this is, from 1."""
    return int(os.environ.get("ORCHESTRATE_ATTEMPT", "1"))


def started(device=None):
    """Reports that the work began."""
    _send("started", pid=os.getpid(), device=device)


def progress(step, total_steps=None, loss=None, tokens_per_s=None):
    """Reports progress; shown on the orchestrator's console."""
    _send("progress", step=int(step), total_steps=total_steps,
          loss=None if loss is None else float(loss),
          tokens_per_s=None if tokens_per_s is None else float(tokens_per_s))


def checkpoint_dir(directory, step=None):
    """Reports every file under `directory` (recursively, in name order) as `checkpoint` would,
    for a checkpoint that is a directory of files (a Hugging Face `save_pretrained` folder, a
    Trainer `checkpoint-N`). Returns how many files it reported."""
    directory = Path(directory)
    files = sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink())
    for path in files:
        checkpoint(path, step=step)
    return len(files)


def checkpoint(path, step=None):
    """Reports a checkpoint file that is completely written (write it to a temporary name and
    rename it into place first). Its SHA-256 and size are computed here, with the file's
    identity (device, inode, modification time); orchestrate records that SHA-256 for the file
    after checking it against the bytes, and fails the stage if they differ (the file changed
    after this report)."""
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        before = os.fstat(f.fileno())
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
        after = os.fstat(f.fileno())
    identity = None
    if (before.st_mtime_ns, before.st_size) == (after.st_mtime_ns, after.st_size):
        identity = {"dev": after.st_dev, "ino": after.st_ino, "mtime_ns": after.st_mtime_ns}
    _send("checkpoint", path=str(path.resolve()), sha256=digest.hexdigest(),
          bytes=after.st_size, step=step, identity=identity)


def released(downstream_may_start=False):
    """Reports that this stage's GPU work is over: no process of the stage holds a CUDA
    context any more. PyTorch cannot destroy its context in a live process, so the usual way
    is to do the GPU work in a child process that exits (multiprocessing, a subprocess), and
    call this from the parent, which then writes the outputs. orchestrate checks the stage's
    GPUs at once: if no process of the stage is listed on them and their memory is back at
    the baseline, they go to the next stage while this one goes on writing. A process of the
    stage that uses a GPU again afterwards is a leak. If the check does not hold yet, nothing
    changes (the GPUs are handed on after the stage ends) and the call may be made again.

    `downstream_may_start=True` also opts in to an early start of the stages after this one:
    a promise that this stage writes its checkpoint the checkpoint way (each file put in
    place whole, `manifest.json` last, listing them with sizes and checksums). A built-in
    stage downstream then starts at once and waits for the manifest; its finish is recorded
    only after this stage's, and it is stopped and started again if this stage fails."""
    if downstream_may_start:
        _send("released", pid=os.getpid(), downstream_may_start=True)
    else:
        _send("released", pid=os.getpid())


def gpu_memory():
    """The GPU memory this stage declared (`gpu_memory` in the plan), in bytes: it shares its
    GPU with other stages. None when it has its GPUs whole (or runs outside orchestrate)."""
    value = os.environ.get("ORCHESTRATE_GPU_MEMORY")
    return int(value) if value else None


def cap_gpu_memory():
    """For a stage that shares its GPU (`gpu_memory`): caps PyTorch's caching allocator at
    what the stage declared (`torch.cuda.set_per_process_memory_fraction` with
    `ORCHESTRATE_GPU_MEMORY_FRACTION`), so that going over raises a CUDA out-of-memory error in
    this stage instead of crowding its neighbours. Imports torch; call it before the first
    CUDA allocation. Returns the fraction set, or None when the stage does not share a GPU or
    no CUDA device is visible (nothing is done then)."""
    fraction = os.environ.get("ORCHESTRATE_GPU_MEMORY_FRACTION")
    if not fraction:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    value = min(max(float(fraction), 0.0), 1.0)
    torch.cuda.set_per_process_memory_fraction(value, 0)
    return value


def metrics(**values):
    """Reports named figures; the last ones go into report.json."""
    _send("metrics", metrics={k: float(v) for k, v in values.items()})


def failed(error, reason=None):
    """Reports a failure (then exit non-zero). `reason` may be "cuda_oom", "bad_input" or
    "interrupted" (stopped on request, see `exit_interrupted`)."""
    _send("failed", error=str(error), reason=reason)


# A plain flag, not a `threading.Event`: a signal handler runs between any two bytecodes of
# the main thread, including those of another handler, so one that takes a lock (as
# `Event.set()` does) deadlocks when a second SIGTERM lands while the first is being handled.
# Rebinding a module global takes no lock.
_stop_requested = False
_previous_handler = None
_watching = False


def _on_sigterm(signum, frame):
    global _stop_requested
    _stop_requested = True
    if callable(_previous_handler):
        _previous_handler(signum, frame)


def watch_stop():
    """From now on SIGTERM (what orchestrate sends to stop a stage: Ctrl-C or SIGTERM to the
    run, a stage timeout, a Slurm preemption) no longer ends the process: it only makes
    `stop_requested()` true, so the training loop can save a checkpoint and exit with
    `exit_interrupted()`. A handler installed before (a Python function) is still called
    after. Only the main thread can install signal handlers: from another thread this does
    nothing and returns False. Calling it again is harmless. Returns whether it is watching."""
    global _previous_handler, _watching
    if _watching:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _on_sigterm)
    _previous_handler = previous if previous is not _on_sigterm else None
    _watching = True
    return True


def unwatch_stop():
    """Puts back the SIGTERM handler that `watch_stop()` replaced (the stop request, if one
    came, stays recorded)."""
    global _previous_handler, _watching
    if not _watching or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _previous_handler if _previous_handler is not None else signal.SIG_DFL)
    _previous_handler = None
    _watching = False


def stop_requested():
    """Whether SIGTERM arrived since `watch_stop()` (or `request_stop()` was called)."""
    return _stop_requested


def request_stop():
    """Records a stop request as SIGTERM would (for a framework's own signal hook, or tests)."""
    global _stop_requested
    _stop_requested = True


def exit_interrupted(message="stopped on request after saving a resumable checkpoint"):
    """Reports the stop (a `failed` event with reason `interrupted`) and exits with
    `EXIT_INTERRUPTED` (75): the stage stopped early, and its next attempt (a retry, or
    `orchestrate resume`) finds what it saved through `resume_dir()`. Never returns."""
    failed(message, reason="interrupted")
    sys.exit(EXIT_INTERRUPTED)
