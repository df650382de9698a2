"""orchestrate's zygote: one Python process that imports a stage's heavy modules once and
forks a fresh process per stage from there.

`orchestrate` runs this file (embedded in its binary) as `PYTHON -c SOURCE FD CONFIG` with the
environment every stage of this zygote shares; CONFIG is a JSON object: `preload` (the modules
as the plan lists them), `learned` (modules stages forked from an earlier generation imported
themselves), `left_out` (learned modules already left out, with why), `per_stage` (`prefixes`
and `names` of the variables orchestrate sets per stage), `lineage` (an id written back with
what stages import), `generation` (which of its lineage's generations this zygote is, for
the log), `visible_gpus` (how many GPUs its stages are given, or null: see `NvmlHold`),
`imports_var` (the request variable naming where a stage writes it), `log`
(a file it appends what it does to, or absent), `read_ahead` (the `argv` and `cwd` of the
stage it is started for, whose script it reads ahead, or null; after a restart, what it read:
`script` and `entries`), and, after a restart, `check_each` and
`verified` (the learned modules checked one by one, and how many of them passed already). It speaks the fork server protocol of
`protocol::fork` on descriptor FD: 4-byte little-endian length, JSON body; each request
carries the new stage's stdout and stderr as SCM_RIGHTS.

Promises:
- the preload imports run with `PYTORCH_NVML_BASED_CUDA_CHECK=1`, and the zygote refuses to
  serve (now or before any later fork) once CUDA was initialised in it: torch says so, the
  CUDA driver says so, it holds `/dev/nvidia-uvm` or maps a device, or the flag file of
  `STAGE_WORKER_SIMULATED_DEVICE_FLAG` exists (tests on machines without a GPU);
- it forks from one thread only: after each preload import and before every fork it counts
  Python's threads and the kernel's (/proc/self/task). A Python thread besides the main one
  is a refusal (it may hold a lock the child would inherit held, forever); so is a native
  thread that a fork leaves running: thread pools that stop themselves in a fork handler
  (OpenBLAS's, started by `import numpy`) are allowed, as the fork itself stops them;
- it forks only code that matches the disk: at ready it records (mtime, size, inode) of every
  module file it imported and the mtime of the site-packages directories (a package
  installed, upgraded or removed), compares them before every fork (stat by stat once an
  inotify watch on their directories saw any change, or always where it has no watch), and on
  a change answers `stale` and exits, so that orchestrate starts a fresh zygote;
- a forked stage reseeds, before its first line, the random generators it inherited: Python's
  `random`, numpy's legacy global state when `numpy.random` is loaded, torch's CPU generator
  when torch is loaded (no new import);
- every environment variable read through `os.environ`/`os.getenv` while importing is
  listed in the ready message, so that orchestrate forks only stages whose values of them
  match;
- NVML is held back while it imports (`NvmlHold`): a module that only initialises NVML at
  import (DeepSpeed) is preloaded without NVML's thread, and its stages initialise NVML at
  their first NVML call;
- a module of the plan's list after whose import it runs a thread a fork leaves running
  (NVML's, which outlives `nvmlShutdown`, when a module uses NVML at import) is left out: the
  zygote execs itself afresh without it, names it with why among the modules left out, and
  the stages import it themselves (`left_out` in CONFIG lists what an earlier generation
  left out: not imported again);
- its stages start with what it holds frozen (`gc.freeze()` before each fork): their
  collections and their exit skip it, as Python advises for a process that forks without
  exec; pyarrow's jemalloc runs without its background thread in the zygote and its stages
  (`JE_ARROW_MALLOC_CONF`, unless the environment sets it), so modules importing pyarrow can
  be preloaded;
- it learns: a learned module is imported after the plan's, and left out (named, with why,
  in the ready message) when its import fails, starts a thread, initialises CUDA or reads a
  variable orchestrate sets per stage (with every learned module under it); as an import
  cannot be undone, throwaway forks of the zygote find which module that is before the zygote
  imports anything (an exec afresh without it only where a fork cannot tell). A forked stage writes, at its exit through Python's own exit
  (atexit), the modules it imported that the zygote had not, and which of them the zygote
  could import from its own sys.path, to the file named by `imports_var` in its request;
- it reads ahead: the script of the stage it is started for (`python SCRIPT`, `python -m
  MODULE`) is parsed (`ast`, nothing of it runs) for its top-level imports (in plain `if` and
  `try` blocks too, not in functions or classes; `from m import Name` as `m:Name`: the module,
  then its attribute, which loads what a lazy module loads on access), and those it could
  import from its own sys.path that are not the user's own (found beside the script or in the
  stage's working directory) are imported after the learned modules, checked as they are, and
  named in the ready message (`read_ahead`). The user's own modules the script imports are
  parsed too (never imported), for what they import at their top level. With learning on,
  each `forked` reply names what the stage's script imports that the zygote lacks (`lacks`,
  read once per version of the script and the user modules read for it), so that its next
  generation imports it;
- a stage process is re-parented to orchestrate (through an intermediate process that exits),
  in its own session, with PR_SET_PDEATHSIG, stdin /dev/null, the stage's stdout/stderr,
  environment, working directory and argv, and runs its script as `python script.py` or
  `python -m module` would (sys.argv, sys.path[0], `__main__`).
"""

import atexit
import ctypes
import gc
import _io
import importlib.machinery
import json
import os
import pkgutil  # noqa: F401 - runpy imports it to run a script: not the stage's import
import re
import runpy
import socket
import struct
import sys
import threading
import time

PROTOCOL_VERSION = 1
SIMULATED_FLAG = "STAGE_WORKER_SIMULATED_DEVICE_FLAG"
PR_SET_PDEATHSIG = 1
# The environment as orchestrate gave it, before any import could change it: a zygote that
# restarts without a learned module (`restart_without`) execs itself with it.
ORIGINAL_ENV = dict(os.environ)

# Settings for this process's native libraries, set where the environment has none of its own
# (through putenv only: not in os.environ, so no import sees them as the stage's environment,
# and a forked stage's environment is its own). `JE_ARROW_MALLOC_CONF`: pyarrow's jemalloc
# starts a background thread at import that a fork leaves running, which made every module
# importing pyarrow (pandas, scikit-learn, transformers' generation and model classes) unfit to
# preload; without it jemalloc purges on its allocation paths instead.
NATIVE_SETTINGS = {"JE_ARROW_MALLOC_CONF": "background_thread:false"}


def set_native_settings():
    for name, value in NATIVE_SETTINGS.items():
        if name not in os.environ:
            os.putenv(name, value)


_STARTED = time.monotonic()
_LOG = None
_GENERATION = None  # which generation of its lineage this zygote is (CONFIG's `generation`)


def log(message):
    """Appends a line to this lineage's log (`log` in CONFIG: a file beside what it learned),
    so that a zygote slow to become ready can be asked what it did: the imports and how long
    they took, every check that failed and every restart, and why."""
    if not _LOG:
        return
    try:
        with open(_LOG, "a") as out:
            out.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()} +{time.monotonic() - _STARTED:.2f}s {message}\n")
    except OSError:
        pass  # the log is a help, never a reason to refuse


class _ReadRecorder:
    """Records the names of environment variables read through os.environ while installed."""

    def __init__(self):
        self.names = set()

    def install(self):
        recorder = self
        plain = type(os.environ)

        class Watched(plain):
            def __getitem__(self, key):
                recorder.names.add(key.decode() if isinstance(key, bytes) else key)
                return plain.__getitem__(self, key)

        self._plain = plain
        os.environ.__class__ = Watched
        if hasattr(os, "environb"):
            os.environb.__class__ = Watched

    def uninstall(self):
        os.environ.__class__ = self._plain
        if hasattr(os, "environb"):
            os.environb.__class__ = self._plain


_DEVICE_MAPPING = re.compile(r"\s(/dev/nvidia(?:-uvm|[0-9])\S*)")


def _torch_cuda_initialised():
    """Whether torch, if imported, initialised CUDA (made a context) in this process."""
    torch = sys.modules.get("torch")
    return torch is not None and hasattr(torch, "cuda") and torch.cuda.is_initialized()


def cuda_touched():
    """Why this process must not fork stages, or None: every sign found, so that a refusal
    says all that is known."""
    signs = []
    if _torch_cuda_initialised():
        signs.append("torch.cuda.is_initialized() is true")
    # An open /dev/nvidia-uvm is not a sign: importing DeepSpeed opens it with /dev/nvidiactl,
    # /dev/nvidia0 and the caps devices while the driver still answers "not initialised", and
    # children forked after that use CUDA (bench/zygote/uvm_probe.py, H200, 2026-12-01). A
    # context maps device files, and an initialised driver answers below.
    # One search over the whole file: a process that imported torch maps thousands of
    # regions, and this check runs after every learned module when they are checked one by one.
    with open("/proc/self/maps") as maps:
        mapped = _DEVICE_MAPPING.search(maps.read())
    if mapped:
        signs.append(f"it maps {mapped.group(1)}")
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        cuda = None
    if cuda is not None:
        count = ctypes.c_int(0)
        # CUDA_ERROR_NOT_INITIALIZED (3) is the answer of a driver nobody initialised.
        answer = cuda.cuDeviceGetCount(ctypes.byref(count))
        if answer != 3:
            signs.append(f"the CUDA driver answers cuDeviceGetCount with {answer}, not 3 (not initialised)")
    flag = os.environ.get(SIMULATED_FLAG)
    if flag and os.path.exists(flag):
        signs.append(f"a device was initialised in the zygote (simulated: {flag} exists)")
    if not signs:
        return None
    return "CUDA was initialised in the zygote: " + "; ".join(signs)


def _os_threads():
    return len(os.listdir("/proc/self/task"))


def threads_running():
    """Why this process must not fork because of its threads, or None.

    A Python thread besides the main one is always a refusal: whatever lock it holds at the
    fork (its own, the logging module's, an allocator's) stays held in the child with no
    thread to release it. A native thread is a refusal only if a fork leaves it running:
    OpenBLAS (loaded by `import numpy`) starts a pool at load and stops it in a
    `pthread_atfork` handler, so a throwaway fork followed by a recount tells a pool that
    makes itself safe from one that does not."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        names = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
        return f"it runs {len(names) + 1} Python threads (besides the main one: {', '.join(names)})"
    if _os_threads() == 1:
        return None
    probe = os.fork()
    if probe == 0:
        os._exit(0)
    os.waitpid(probe, 0)
    # A thread stopped by a fork handler may linger in /proc for a moment after its join.
    deadline = time.monotonic() + 0.5
    while _os_threads() > 1 and time.monotonic() < deadline:
        time.sleep(0.005)
    count = _os_threads()
    if count == 1:
        return None
    return (f"it runs {count} threads ({', '.join(_thread_names())} besides the main one), and a fork leaves"
            " them running (native threads no fork handler stops)")


def _thread_names():
    """The names the kernel has for this process's threads other than the main one (what a
    library named its thread, e.g. `cuda-EvtHandlr`), each once, with a count where several."""
    names = {}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == os.getpid():
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return [f"{n} x{c}" if c > 1 else n for n, c in sorted(names.items())] or ["?"]


def _site_directories():
    site = sys.modules.get("site")
    found = []
    if site is not None:
        for getter in ("getsitepackages", "getusersitepackages"):
            try:
                got = getattr(site, getter)()
            except (AttributeError, OSError):
                continue
            found.extend([got] if isinstance(got, str) else got)
    return [d for d in found if os.path.isdir(d)]


def _identity(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _loaded_paths():
    """Every imported module's file, and the site-packages directories."""
    paths = {
        m.__file__
        for m in list(sys.modules.values())
        if isinstance(getattr(m, "__file__", None), str) and os.path.isabs(m.__file__)
    }
    paths.update(_site_directories())
    return paths


def loaded_files(paths=None):
    """What the imported code was read from (`paths`, by default `_loaded_paths()`), as
    `{path: (mtime_ns, size, inode)}`: every module's file (the interpreter's own modules too:
    an upgrade replaces them as well) and the site-packages directories, whose mtime changes
    when a package is installed, upgraded or removed (a new `.pth`, `.dist-info`)."""
    recorded = {}
    for path in _loaded_paths() if paths is None else paths:
        identity = _identity(path)
        if identity is not None:  # a module whose __file__ names nothing on disk
            recorded[path] = identity
    return recorded


def changed_on_disk(recorded):
    """The first recorded file that is no longer what was imported, described, or None."""
    for path, identity in recorded.items():
        now = _identity(path)
        if now != identity:
            what = "was removed" if now is None else "changed"
            return f"{path} {what} since the zygote imported it"
    return None


IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
# A file written, its attributes changed, or an entry created, removed or renamed.
IN_CHANGES = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800


class LoadedFiles:
    """The files the zygote imported (`loaded_files`), and an inotify watch on the directories
    that hold them, so that the check before each fork stats them all only when something in
    those directories changed since the last look (with thousands of files, that is most of a
    fork's own cost). Without inotify (or past its watch limit) every check stats them all."""

    def __init__(self):
        self.fd = None
        paths = _loaded_paths()
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            fd = -1
        if fd >= 0:
            self.fd = fd
            site = set(_site_directories())
            directories = {p if p in site else os.path.dirname(p) for p in paths}
            for directory in directories:
                if libc.inotify_add_watch(fd, os.fsencode(directory), IN_CHANGES) < 0:
                    self.close()
                    break
        self.recorded = loaded_files(paths)  # after the watches: a change from now on is seen
        self.seen_change = self.fd is None

    def changed(self):
        """The first file no longer what was imported, described, or None."""
        if self.fd is not None:
            try:
                while os.read(self.fd, 1 << 16):
                    self.seen_change = True
            except BlockingIOError:
                pass
        if not self.seen_change:
            return None
        why = changed_on_disk(self.recorded)
        # A change elsewhere in those directories (a new file beside a module): look again
        # only at the next event.
        self.seen_change = self.fd is None
        return why

    def close(self):
        """In a forked stage: the watch is the zygote's."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def reseed_inherited_generators():
    """In a forked stage: gives the generators seeded in the zygote fresh seeds from the
    system's entropy, as a fresh interpreter's would be. Imports nothing: a generator whose
    module the zygote did not load is seeded by the stage's own import."""
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None and hasattr(numpy_random, "seed"):
        numpy_random.seed()  # the legacy global RandomState behind np.random.rand & co
    torch = sys.modules.get("torch")
    generator = getattr(torch, "default_generator", None) if torch is not None else None
    if generator is not None:
        generator.seed()  # CUDA's generators are made in the stage, when it initialises CUDA


def send(sock, message):
    body = json.dumps(message).encode()
    sock.sendall(struct.pack("<I", len(body)) + body)


def receive(sock):
    """One request and its descriptors (two: the stage's stdout and stderr; a standby
    request a third, the standby's own socket), or None at end of file."""
    head, fds, _, _ = socket.recv_fds(sock, 4, 3)
    if not head:
        return None
    while len(head) < 4:
        more = sock.recv(4 - len(head))
        if not more:
            raise EOFError("the request's length was cut short")
        head += more
    (length,) = struct.unpack("<I", head)
    body = b""
    while len(body) < length:
        more = sock.recv(length - len(body))
        if not more:
            raise EOFError("the request was cut short")
        body += more
    request = json.loads(body)
    want = 3 if isinstance(request, dict) and request.get("standby") else 2
    if len(fds) != want:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a request carries {want} descriptors, this one {len(fds)}")
    return request, fds


def become_stage(request, fds, sock, pid_pipe):
    """In the new stage process: take on the stage's attributes. Returns its argv."""
    parent = request["parent"]
    deadline = time.monotonic() + 5
    while os.getppid() != parent:
        if time.monotonic() > deadline:
            os._exit(1)
        time.sleep(0.00005)
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0) != 0:
        os._exit(1)
    if os.getppid() != parent:  # orchestrate died before the flag was set
        os._exit(1)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    for fd in (null, sock.fileno(), pid_pipe):
        if fd > 2:
            os.close(fd)
    sock.detach()
    import signal

    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    take_on(request, fds)
    return request["argv"]


def take_on(stage, fds):
    """Takes on what `stage` (a fork request, or a standby's adoption) gives this process: its
    stdout and stderr (`fds`, then closed), its whole environment, and its working directory."""
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds[:2]:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(dict(stage["env"]))
    for name in NATIVE_SETTINGS:  # the zygote's own, set with putenv: not the stage's
        if name not in os.environ:
            os.unsetenv(name)
    os.chdir(stage["cwd"])


CLONE_NEWCGROUP = 0x02000000


def enter_cgroup_namespace():
    """Puts this process (the intermediate, now in the stage's cgroup) in a cgroup namespace
    of its own rooted there, which the stage it forks is born in; where the kernel refuses
    (no CAP_SYS_ADMIN) it stays without one, as an exec'd stage would."""
    unshare = getattr(os, "unshare", None)
    try:
        if unshare is not None:
            unshare(CLONE_NEWCGROUP)
        else:
            ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWCGROUP)
    except OSError:
        pass


def fork_stage(request, fds, sock):
    """Forks the stage through an intermediate process. In the zygote returns
    ("forked", pid); in the stage ("stage", argv)."""
    if request.get("v") != PROTOCOL_VERSION:
        raise ValueError(f"request of protocol version {request.get('v')}, this zygote speaks {PROTOCOL_VERSION}")
    sys.stdout.flush()
    sys.stderr.flush()
    # What the zygote holds now is never garbage in a stage: the stage's collector skips it
    # (the fork shares its pages instead of copying them as collections touch them), and its
    # exit does not walk it (an interpreter with torch and transformers loaded exits in 0.23 s
    # instead of 1.10 s, bench/zygote/exit_probe.py). Python's own advice for a process that
    # forks without exec.
    gc.freeze()
    read_end, write_end = os.pipe()
    intermediate = os.fork()
    if intermediate == 0:
        # Into the stage's cgroup first, so that the stage is born in it.
        cgroup = request.get("cgroup")
        if cgroup:
            try:
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
                    procs.write("0")
            except OSError:
                os.write(write_end, struct.pack("<i", -1))
                os._exit(0)
            if request.get("cgroup_namespace"):
                enter_cgroup_namespace()
        stage = os.fork()
        if stage == 0:
            os.close(read_end)
            return "stage", become_stage(request, fds, sock, write_end)
        os.write(write_end, struct.pack("<i", stage))
        os._exit(0)
    os.close(write_end)
    for fd in fds:
        os.close(fd)
    data = os.read(read_end, 4)
    os.close(read_end)
    os.waitpid(intermediate, 0)
    if len(data) != 4 or struct.unpack("<i", data)[0] <= 0:
        raise OSError("the intermediate process could not fork")
    return "forked", struct.unpack("<i", data)[0]


def preload(sock, config):
    """Imports the plan's modules, checking after each that this process may still fork (so
    that a refusal names the import that made it unsafe: the user can preload less), then the
    learned ones (see `import_learned`; they end with what the stage's script imports, read
    ahead). Returns the names of the environment variables the imports read, the learned
    modules left out and the entries read ahead that the plan's list did not import, or None
    once it refused."""
    recorder = _ReadRecorder()
    recorder.install()
    try:
        skip = {entry["module"] for entry in config.get("left_out", [])}
        for name in config.get("preload", []):
            if name in skip:
                continue  # an earlier generation found it unfit: stages import it themselves
            try:
                __import__(name)
            except BaseException as error:  # noqa: BLE001 - any failure is a refusal
                log(f"refused: importing preload module `{name}` failed: {error!r}")
                send(sock, {"reply": "refused", "reason": f"importing preload module `{name}` failed: {error!r}"})
                return None
            why = cuda_touched()
            if why:
                log(f"refused: after importing `{name}`, {why}")
                send(sock, {"reply": "refused", "reason": f"after importing `{name}`, {why}"})
                return None
            why = threads_running()
            if why:
                restart_without_listed(sock, config, name, f"after importing it, {why}")
        log(f"imported the plan's {len(config.get('preload', []))} modules")
        ahead = config.get("read_ahead") or {}
        needed = [e for e in ahead.get("entries", []) if not _held(e)]
        left_out = import_learned(sock, config, recorder)
    finally:
        recorder.uninstall()
    return recorder.names, left_out, needed


class NvmlHold:
    """NVML held back while the zygote imports, so that a module that only initialises NVML
    at import can be preloaded. NVML's init starts a native thread that a fork leaves running
    (and that outlives `nvmlShutdown`: bench/zygote/nvml_thread_lifetime.py), and DeepSpeed
    initialises it twice at import: its accelerator's detection asks torch for the device
    count (NVML through ctypes, under `PYTORCH_NVML_BASED_CUDA_CHECK`), and its CUDA
    accelerator calls `pynvml.nvmlInit()`. While held:
    - `pynvml`'s init loads the library (failing as the real one does where it is missing)
      and is recorded, not run; any other NVML call through `pynvml` runs the recorded inits
      first, so a module that really uses NVML at import still starts the thread and is left
      out, as without the hold. A forked stage runs them at its first NVML call; an
      `nvmlShutdown` with inits still recorded takes one back;
    - torch's NVML device count answers `visible_gpus` (CONFIG: the entries of the
      `CUDA_VISIBLE_DEVICES` orchestrate gave this zygote's stages), without NVML.
    `release` (at ready) restores torch's count and lets new inits through. The hooks apply to
    modules imported after `install`, found by a finder first on `sys.meta_path`."""

    def __init__(self, visible_gpus):
        self.visible_gpus = visible_gpus
        self.holding = False
        self.recorded = []  # the flags of each init recorded
        self.initialising = False
        self.torch_cuda = None  # (module, its own device count) while patched

    def install(self):
        self.holding = True
        hooks = {"pynvml": self._hold_pynvml}
        if self.visible_gpus is not None:
            hooks["torch.cuda"] = self._hold_torch_count
        for name, hook in hooks.items():
            if name in sys.modules:
                hook(sys.modules[name])
        sys.meta_path.insert(0, _AfterImport(hooks))

    def release(self):
        self.holding = False
        if self.recorded or self.torch_cuda is not None:
            log(f"NVML held back while importing: {len(self.recorded)} init(s) left to the stages"
                + (f"; torch's NVML device count answered {self.visible_gpus}" if self.torch_cuda else ""))
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]
        if self.torch_cuda is not None:
            module, own = self.torch_cuda
            module._device_count_nvml = own
            self.torch_cuda = None

    def _hold_torch_count(self, module):
        own = getattr(module, "_device_count_nvml", None)
        if own is None:
            return
        self.torch_cuda = (module, own)
        module._device_count_nvml = lambda: self.visible_gpus

    def _hold_pynvml(self, nvml):
        init, shutdown, pointer = (getattr(nvml, n, None) for n in
                                   ("nvmlInitWithFlags", "nvmlShutdown", "_nvmlGetFunctionPointer"))
        load = getattr(nvml, "_LoadNvmlLibrary", None)
        if None in (init, shutdown, pointer, load):
            return  # not the pynvml this knows: left as it is

        def run_recorded():
            if not self.recorded or self.initialising:
                return
            self.initialising = True
            try:
                while self.recorded:
                    init(self.recorded[0])
                    self.recorded.pop(0)
            finally:
                self.initialising = False

        def held_init(flags):
            if self.holding and not self.initialising:
                load()
                self.recorded.append(flags)
                return None
            run_recorded()
            return init(flags)

        def held_shutdown():
            if self.recorded and not self.initialising:
                self.recorded.pop()
                return None
            return shutdown()

        def held_pointer(name):
            run_recorded()
            return pointer(name)

        nvml.nvmlInitWithFlags = held_init
        nvml.nvmlShutdown = held_shutdown
        nvml._nvmlGetFunctionPointer = held_pointer


class _AfterImport:
    """A `sys.meta_path` finder that runs `hooks[name](module)` right after module `name` is
    executed (the finders after it find it; its loader is wrapped)."""

    def __init__(self, hooks):
        self.hooks = hooks

    def find_spec(self, name, path, target=None):
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, hook)
        return spec


class _HookedLoader:
    def __init__(self, loader, hook):
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.hook(module)
        except Exception as error:  # noqa: BLE001 - a hook never fails an import
            log(f"NVML hold: no hook on {module.__name__}: {error!r}")

    def __getattr__(self, name):
        return getattr(self.loader, name)


def visible_gpus(config):
    """How many GPUs this zygote's stages are given (CONFIG's `visible_gpus`), or None."""
    value = config.get("visible_gpus")
    return value if isinstance(value, int) and value >= 0 else None


def _per_stage_read(names, per_stage):
    prefixes = per_stage.get("prefixes", [])
    exact = set(per_stage.get("names", []))
    read = sorted(n for n in names if n in exact or any(n.startswith(p) for p in prefixes))
    if not read:
        return None
    return f"it reads {', '.join(read)}, which orchestrate sets for each stage"


def import_learned(sock, config, recorder):
    """Imports the learned modules in the order stages imported them, whole, and checks once
    (the usual case: they all fit). One whose import fails is left out; so is one after which
    this process may not fork (a thread, CUDA) or whose import read a per-stage variable, with
    every learned module under it. As an import cannot be undone, a list that leaves this
    process unfit makes it exec itself afresh (`restart_checking_each`) to find which modules
    did (`_import_finding_unfit`). Returns the modules left out, each `{"module", "reason"}`."""
    if config.get("check_each"):
        return _import_finding_unfit(sock, config, recorder)
    left_out = list(config.get("left_out", []))
    learned = config.get("learned", [])
    started, before = time.monotonic(), set(recorder.names)
    _import_each(learned, left_out)
    why = unfit(recorder.names - before, config)
    log(f"imported {len(learned)} learned modules whole in {time.monotonic() - started:.1f} s; "
        + (f"unfit: {why}" if why else "fit to fork"))
    if why:
        restart_checking_each(sock, config, left_out)
    return left_out


def _import_finding_unfit(sock, config, recorder):
    """After a restart (`check_each`): throwaway forks of this process find the modules that
    make it unfit, each fork importing the list one by one from where the last stopped and
    naming the first such module (`_first_unfit`), while this process imports only the
    stretches they found fit and leaves each culprit out with the modules under it: one
    restart in all, however many culprits. Where a fork cannot tell (it crashed), or
    `in_process` is set, the modules are checked in this process, and each culprit costs a
    restart without it (`restart_without`); the first `verified` were checked before."""
    left_out = list(config.get("left_out", []))
    learned = list(config.get("learned", []))
    started, before = time.monotonic(), set(recorder.names)
    i = min(config.get("verified", 0), len(learned))
    _import_each(learned[:i], left_out)
    while i < len(learned):
        if config.get("in_process"):
            found = _first_unfit(learned, i, recorder, config)
            if found:
                why = f"after importing it, {found[2]}"
                restart_without(sock, dict(config, learned=learned), left_out, found[1], why, verified=found[0])
            _import_each(learned[i:], left_out)  # records those whose import failed
            break
        try:
            found = _in_fork(lambda: _first_unfit(learned, i, recorder, config))
        except (OSError, ValueError) as error:
            log(f"a fork could not check the learned modules ({error}); checking them in this process")
            config = dict(config, in_process=True)
            continue
        upto = len(learned) if found is None else found[0]
        _import_each(learned[i:upto], left_out)
        if found is None:
            break
        _, name, why = found
        learned, under = _without(learned, name)
        left_out.append({"module": name, "reason": _reason(f"after importing it, {why}", under)})
        log(f"leaving out learned module `{name}` (a fork found it at {upto}): {left_out[-1]['reason']}")
        i = upto
    why = unfit(recorder.names - before, config)
    log(f"imported {len(learned)} learned modules in {time.monotonic() - started:.1f} s; "
        + (f"unfit: {why}; checking them in this process" if why else "fit to fork"))
    if why:
        # The forks found each stretch fit, yet together they are not: the sure, slow way.
        _restart(sock, dict(config, learned=learned, left_out=left_out, verified=0, in_process=True),
                 "learned modules made the zygote unfit to fork, and it could not restart to find which")
    return left_out


def _in_fork(work):
    """Runs `work()` in a throwaway child of this process and returns what it returned (JSON
    data). Raises ValueError when the child said nothing (it crashed)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            answer = json.dumps({"answer": work()}).encode()
            with os.fdopen(write_end, "wb") as out:
                out.write(answer)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    if not data:
        raise ValueError("the fork ended without an answer")
    return json.loads(data)["answer"]


def _first_unfit(learned, start, recorder, config):
    """Imports `learned[start:]` one by one, each module's packages first, and checks after
    each import that loaded something. Returns `[index, module, why]` for the first that
    leaves this process unfit (`module`: the package whose import did it), or None. A module
    whose import fails is passed over (whoever imports them for good records it).

    Packages first: importing `pkg.sub` runs `pkg/__init__.py` first, and when that is what
    makes the process unfit, `pkg` is the module to leave out, with every module under it."""
    for i in range(start, len(learned)):
        for part in _packages_then(learned[i]):
            if _held(part):
                continue
            loaded, read = len(sys.modules), set(recorder.names)
            try:
                _import_entry(part)
            except BaseException:  # noqa: BLE001 - a module that fails is passed over
                break
            if len(sys.modules) == loaded and recorder.names == read:
                continue  # it loaded nothing new: nothing new to check
            why = unfit(recorder.names - read, config)
            if why:
                return [i, part, why]
    return None


def _within(entry, name):
    """Whether importing `entry` (a module, or `module:Name`) imports module `name`."""
    return entry == name or entry.startswith((name + ".", name + ":"))


def _without(learned, name):
    """`learned` less `name` and every entry under it; and those under it."""
    under = [m for m in learned if m != name and _within(m, name)]
    return [m for m in learned if not _within(m, name)], under


def _reason(why, under):
    if not under:
        return why
    named = ", ".join(under[:3]) + (" …" if len(under) > 3 else "")
    return f"{why} (left out with its learned submodule{'s' if len(under) > 1 else ''} {named})"


def _packages_then(name):
    """`a.b.c` -> `a`, `a.b`, `a.b.c`; `a.b:C` -> `a`, `a.b`, `a.b:C`."""
    module, attribute = _entry_parts(name)
    parts = module.split(".")
    chain = [".".join(parts[: n + 1]) for n in range(len(parts))]
    return chain + ([name] if attribute else [])


def _entry_parts(entry):
    """`a.b:C` -> (`a.b`, `C`); `a.b` -> (`a.b`, None)."""
    module, _, attribute = entry.partition(":")
    return module, attribute or None


def _import_entry(entry):
    """Imports `entry`: a module (`a.b`), or `a.b:C` as `from a.b import C` would: the module,
    then its attribute `C` (which a lazy module, as transformers' are, loads on access), or
    else its submodule `a.b.C`. Raises what that import raises."""
    module, attribute = _entry_parts(entry)
    __import__(module)
    if attribute is None:
        return
    try:
        getattr(sys.modules[module], attribute)
    except AttributeError:
        __import__(f"{module}.{attribute}")
    _ATTRIBUTES_IMPORTED.add(entry)


_ATTRIBUTES_IMPORTED = set()  # the `module:Name` entries `_import_entry` imported here


def _held(entry):
    """Whether this process holds `entry` (a module, or `module:Name` with `Name` loaded)."""
    module, attribute = _entry_parts(entry)
    loaded = sys.modules.get(module)
    if loaded is None or attribute is None:
        return loaded is not None
    return (entry in _ATTRIBUTES_IMPORTED or attribute in getattr(loaded, "__dict__", {})
            or f"{module}.{attribute}" in sys.modules)


def _import_each(names, left_out):
    """Imports `names` (modules, or `module:Name` entries) in order; one whose import fails is
    added to `left_out`."""
    for name in names:
        if _held(name):
            continue
        try:
            _import_entry(name)
        except BaseException as error:  # noqa: BLE001 - a module that fails is left out
            left_out.append({"module": name, "reason": f"importing it failed: {error!r}"})


def unfit(names_read, config):
    """Why this process may not fork stages after imports that read `names_read`, or None."""
    return cuda_touched() or threads_running() or _per_stage_read(names_read, config.get("per_stage", {}))


def restart_checking_each(sock, config, left_out):
    """Execs this zygote afresh to import the learned modules one at a time, checking after
    each, since importing them all made this process unfit to fork."""
    log("restarting to check the learned modules one by one")
    _restart(sock, dict(config, check_each=True, verified=0, left_out=left_out),
             "learned modules made the zygote unfit to fork, and it could not restart to find which")


def restart_without(sock, config, left_out, name, why, verified=0):
    """Execs this zygote afresh with `name` left out, and every learned module under it (each
    would import it again), as its import made this process unfit to fork and cannot be
    undone; the `verified` modules before it passed their checks (none of them is under `name`:
    importing one would have imported `name`)."""
    config = dict(config, verified=verified)
    config["learned"], under = _without(config.get("learned", []), name)
    why = _reason(why, under)
    log(f"restarting without learned module `{name}` ({verified} before it checked): {why}")
    config["left_out"] = left_out + [{"module": name, "reason": why}]
    _restart(sock, config, f"learned module `{name}`: {why}; and the zygote could not restart without it")


def restart_without_listed(sock, config, name, why):
    """Execs this zygote afresh without the plan's module `name`, whose import made this
    process unfit to fork (it starts a thread, as DeepSpeed does through NVML on a GPU host, or
    initialises CUDA): the rest of the plan's list is still preloaded, and the stages import
    `name` themselves. It is named, with why, among the modules left out."""
    log(f"restarting without the plan's module `{name}`: {why}")
    config = dict(config, left_out=list(config.get("left_out", [])) + [{"module": name, "reason": why}])
    _restart(sock, config, f"after importing `{name}`, {why}; and the zygote could not restart without it")


def _restart(sock, config, refusal):
    """Execs this zygote afresh with `config` (same PID; `sock` stays open across the exec).
    If the exec fails, the zygote refuses with `refusal` and the error, and exits."""
    with open("/proc/self/cmdline", "rb") as cmdline:
        args = cmdline.read().split(b"\0")[:-1]
    args[-1] = json.dumps(config).encode()
    try:
        os.set_inheritable(sock.fileno(), True)
        os.execve(args[0], args, ORIGINAL_ENV)
    except OSError as error:
        send(sock, {"reply": "refused", "reason": f"{refusal}: {error}"})
        os._exit(1)


def _reachable_from(top, module, path, cache):
    """Whether the top-level module `top` (the stage's `module`) is what an import of it from
    `path` (the zygote's sys.path) finds: not a module of the stage's own directory, nor one
    that shadows another of the same name."""
    if top not in cache:
        if top in sys.builtin_module_names:
            cache[top] = True
        else:
            try:
                found = importlib.machinery.PathFinder.find_spec(top, path)
            except (ImportError, ValueError):
                found = None
            theirs = getattr(module, "__spec__", None)
            # transformers' lazy modules list their locations as Path objects: compare text.
            where = lambda spec: [str(p) for p in (spec.submodule_search_locations or [])]  # noqa: E731
            cache[top] = (
                found is not None
                and theirs is not None
                and found.origin == theirs.origin
                and where(found) == where(theirs)
            )
    return cache[top]


def preloadable(names, path):
    """Those of `names` (modules this stage imported) that the zygote could import as the
    stage did: named as they are loaded (no alias, no `__main__`), their top-level package
    found through the zygote's `path` where the stage found it."""
    cache = {}
    chosen = []
    for name in names:
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        if name.startswith("__") or spec is None or spec.name != name:
            continue
        if not all(part.isidentifier() for part in name.split(".")):
            continue
        top = name.split(".")[0]
        if _reachable_from(top, sys.modules.get(top), path, cache):
            chosen.append(name)
    return chosen


def note_imports_at_exit(to, lineage, had, path):
    """In a forked stage: at its exit through Python's exit, writes to `to` the modules it
    imported that the zygote (`had`) had not, and those the zygote could import (`path`, its
    sys.path). Never fails the stage."""
    pid = os.getpid()

    def write():
        if os.getpid() != pid:  # a child of the stage that exits through Python
            return
        try:
            imported = [name for name in list(sys.modules) if name not in had]
            body = json.dumps({"lineage": lineage, "imported": imported, "preloadable": preloadable(imported, path)})
            partial = to + ".partial"
            with open(partial, "w") as out:
                out.write(body)
            os.replace(partial, to)
        except Exception:  # noqa: BLE001 - learning is best effort
            pass

    atexit.register(write)


def unsafe_to_fork(recorded):
    """The reply that refuses a fork now, or None: CUDA or threads make this zygote unsafe
    for good ("refused"), a preloaded file changed makes it out of date ("stale")."""
    why = cuda_touched()
    if why:
        return {"reply": "refused", "reason": why}
    why = threads_running()
    if why:
        return {"reply": "refused", "reason": f"the zygote is no longer safe to fork: {why}"}
    why = recorded.changed()
    if why:
        return {"reply": "stale", "reason": why}
    return None


# Standbys: a stage-to-be forked ahead of its stage (a `standby` request, after a stage with
# GPUs was forked), which starts the CUDA driver and imports what the zygote could not while
# the stages before it run, then waits on a socket of its own for the stage it becomes
# (protocol::fork::Adopt). orchestrate hands it the next stage whose driver variables match.

STANDBY_WAIT = 120  # seconds a standby waits for its stage before it exits
DRIVER_PREFIXES = ("CUDA_", "NVIDIA_", "__NV", "LD_")


def imported_ahead_by_standbys(left_out):
    """The modules a standby imports before its stage: those the zygote left out because a
    thread they start would not survive a fork (DeepSpeed, through NVML), which a process that
    forks no more may hold. Not those that initialised CUDA, read a per-stage variable or
    failed."""
    return [entry["module"] for entry in left_out if "thread" in entry.get("reason", "")]


def driver_env(env):
    """The variables the CUDA driver and its loader may read at its start (as
    `protocol::fork::driver_env`)."""
    return sorted((k, v) for k, v in env.items() if k.startswith(DRIVER_PREFIXES))


def start_cuda_driver():
    """cuInit, where the driver is installed: no context, no device memory, nothing NVML lists."""
    try:
        return ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
    except (OSError, AttributeError):
        return False


def context_made():
    """Why this process (a standby, whose driver was started) holds a CUDA context, or None:
    asked of torch and of the driver itself (a current context, or a device's primary context
    active), which answer without making one. Where no driver is loaded there is none."""
    if _torch_cuda_initialised():
        return "torch.cuda.is_initialized() is true"
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        return None
    current = ctypes.c_void_p()
    if cuda.cuCtxGetCurrent(ctypes.byref(current)) == 0 and current.value:
        return "a CUDA context is current"
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    for index in range(count.value):
        device, flags, active = ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0)
        if cuda.cuDeviceGet(ctypes.byref(device), index) != 0:
            continue
        state = cuda.cuDevicePrimaryCtxGetState(device.value, ctypes.byref(flags), ctypes.byref(active))
        if state == 0 and active.value:
            return f"device {index}'s primary context is active"
    return None


def _device_files_mapped():
    """The NVIDIA device files this process maps (for the log: what the driver's start maps)."""
    with open("/proc/self/maps") as maps:
        return sorted(set(re.findall(r"\s(/dev/nvidia\S*)", maps.read())))


def _import_recording(names):
    """Imports `names` (one that fails is passed over: the stage's own import fails the same
    way, and says so); returns those imported and the variables read through os.environ."""
    recorder = _ReadRecorder()
    recorder.install()
    imported = []
    try:
        for name in names:
            try:
                _import_entry(name)
                imported.append(name)
            except BaseException:  # noqa: BLE001
                pass
    finally:
        recorder.uninstall()
    return imported, recorder.names


def _adoption_refused(adopt, standby_env, read, recorded):
    """Why this standby must not become the stage of `adopt`, or None."""
    if adopt.get("v") != PROTOCOL_VERSION:
        return f"an adoption of protocol version {adopt.get('v')}, this standby speaks {PROTOCOL_VERSION}"
    stage_env = dict(adopt["env"])
    if driver_env(stage_env) != driver_env(standby_env):
        return "the stage's driver variables differ from those the standby started the driver under"
    differ = sorted(n for n in read if stage_env.get(n) != standby_env.get(n))
    if differ:
        return f"its imports ahead read {', '.join(differ)}, which the stage sets otherwise"
    return changed_on_disk(recorded.recorded)


def wait_for_stage(sock, ahead, recorded):
    """In a standby (already a stage's process, under the environment it was asked for: a
    stage's, less the variables orchestrate sets per stage, as the zygote's): starts the CUDA
    driver, imports `ahead`, says it is ready, and waits for the stage on `sock` (orchestrate
    passes a standby over until it is ready, rather than wait for it). Returns the stage's argv
    once it has taken the stage on and answered with its PID; exits (status 0) when it is
    refused, holds a context, or nobody comes within STANDBY_WAIT."""
    standby_env = dict(os.environ)
    driver = start_cuda_driver()
    imported, read = _import_recording(ahead)
    gc.freeze()
    made = context_made()
    if made:
        log(f"standby: a CUDA context was made ahead of the stage ({made}); exiting")
        os._exit(0)
    log(f"standby ready (generation {_GENERATION}): driver {'started' if driver else 'absent'}, imported ahead {imported}, "
        f"device files mapped {_device_files_mapped()}")
    send(sock, {"reply": "ready", "pid": os.getpid(), "threads": _os_threads()})
    sock.settimeout(STANDBY_WAIT)
    try:
        got = receive(sock)
    except (OSError, ValueError, EOFError):
        got = None
    if got is None:
        os._exit(0)
    adopt, fds = got
    why = _adoption_refused(adopt, standby_env, read, recorded)
    if why:
        log(f"standby refused: {why}")
        send(sock, {"reply": "refused", "reason": why})
        os._exit(0)
    if adopt.get("cgroup_namespace"):
        enter_cgroup_namespace()
    take_on(adopt, fds)
    send(sock, {"reply": "forked", "pid": os.getpid()})
    sock.close()
    return adopt["argv"]


# Reading ahead: the modules a stage's script imports at its top level, read from its source
# (`ast`, nothing run), so that a zygote holds them before the first stage it forks imports
# them (transformers' model classes, which a preload list naming `transformers` does not load).

MAX_READ_AHEAD = 200  # entries taken from one script (with its user modules) at most
MAX_OWN_DEPTH = 3  # user modules are followed this many imports deep from the script at most
MAX_OWN_FILES = 50  # user modules' files read for one script at most
_SCANS = {}  # (script, cwd) -> {file read: identity}: what the fork it was scanned for told


def _script_of(argv, cwd):
    """The source file a `python SCRIPT …` / `python -m MODULE …` command runs, how the
    command names it, and the directory its own modules are found in (`sys.path[0]` of the
    stage): (path, named, directory), or None (a module not found as a `.py` file)."""
    if len(argv) < 2:
        return None
    if argv[1] != "-m":
        path = os.path.join(cwd, argv[1])
        return path, argv[1], os.path.dirname(os.path.realpath(path))
    if len(argv) < 3:
        return None
    name, search, spec = argv[2], [cwd] + sys.path, None
    parts = name.split(".")
    try:
        for n in range(len(parts)):
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: n + 1]), search)
            if spec is None:
                return None
            search = spec.submodule_search_locations
            if search is None and n + 1 < len(parts):
                return None
        if spec.submodule_search_locations is not None:  # a package: its __main__ runs
            spec = importlib.machinery.PathFinder.find_spec(name + ".__main__", spec.submodule_search_locations)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    if not isinstance(origin, str) or not origin.endswith(".py"):
        return None
    return origin, f"-m {name}", cwd


def _top_level_imports(path):
    """The imports at the top level of the source file at `path` (and in the plain `if` and
    `try` blocks there; not in functions or classes), in order, each once: (entries, relative).
    `import a.b` gives the entry `a.b`, `from a.b import C` gives `a.b:C` (`a.b` for `*`);
    `__future__` is skipped; a relative import is given in `relative` as (level, module or
    "", names). Read with `ast`: nothing of the file runs. Raises OSError, SyntaxError,
    ValueError."""
    import ast

    with open(path, "rb") as source:
        tree = ast.parse(source.read(), filename=path)
    entries, relative = [], []

    def add(entry):
        if entry not in entries:
            entries.append(entry)

    def visit(body):
        for node in body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    relative.append((node.level, node.module or "", [a.name for a in node.names]))
                    continue
                if not node.module or node.module == "__future__":
                    continue
                for alias in node.names:
                    add(node.module if alias.name == "*" else f"{node.module}:{alias.name}")
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return entries, relative


def script_imports(path):
    """The entries the script at `path` imports at its top level (see `_top_level_imports`),
    at most MAX_READ_AHEAD; relative imports are skipped. Raises OSError, SyntaxError,
    ValueError."""
    return _top_level_imports(path)[0][:MAX_READ_AHEAD]


def _module_files(name, search, then=None):
    """The `.py` files importing module `name` (dotted) from directories `search` runs: each
    package's `__init__.py` on the way and the module's own file; with `then`, also that of
    submodule `name.then` when `name` is a package (as `from name import then` may import
    it). Empty when `name` is not found there."""
    files, parts, spec = [], name.split(".") + ([then] if then else []), None
    try:
        for n, part in enumerate(parts):
            if n and (spec is None or spec.submodule_search_locations is None):
                break
            if not part.isidentifier():
                break
            where = search if n == 0 else list(spec.submodule_search_locations)
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: n + 1]), where)
            if spec is None:
                break
            origin = getattr(spec, "origin", None)
            if isinstance(origin, str) and origin.endswith(".py"):
                files.append(origin)
    except (ImportError, ValueError):
        pass
    return files


def _own_files(entry, own_dirs):
    """The source files of the user's own module (found in `own_dirs`) that importing `entry`
    runs; empty when `entry` is not the user's own."""
    module, attribute = _entry_parts(entry)
    return _module_files(module, own_dirs, attribute)


def _relative_files(path, relative, own_dirs):
    """The files the relative imports `relative` of the module at `path` name (resolved
    against its package, the directory of `path`), those that lie under `own_dirs` only."""
    roots = [os.path.realpath(d) + os.sep for d in own_dirs]
    files = []
    for level, module, names in relative:
        base = os.path.dirname(os.path.realpath(path))
        for _ in range(level - 1):
            base = os.path.dirname(base)
        if not (base + os.sep).startswith(tuple(roots)):
            continue
        if not module:  # `from . import a, b`: each a module of the package
            for name in names:
                files += _module_files(name, [base])
            continue
        for name in names:
            files += _module_files(module, [base], None if name == "*" else name)
    return files


def _imports_following_own(path, own_dirs):
    """What the script at `path` imports at its top level, as `_top_level_imports`' entries,
    with the user's own modules it imports (found in `own_dirs`, or through relative imports
    inside them) read too, never imported: their entries come before the entry that names
    them, as their imports run first. A user module is read once (cycles end there), at most
    MAX_OWN_DEPTH imports deep and MAX_OWN_FILES files in all. Returns (entries, at most
    MAX_READ_AHEAD; {every file read: its identity}). Raises what reading the script raises;
    a user module that cannot be read is passed over."""
    read = {os.path.realpath(path): _identity(path)}
    entries = []

    def follow(files, depth):
        for file in files:
            real = os.path.realpath(file)
            if depth > MAX_OWN_DEPTH or real in read or len(read) > MAX_OWN_FILES:
                continue
            read[real] = _identity(real)
            try:
                visit(real, depth)
            except Exception as error:  # noqa: BLE001 - a module it cannot read is passed over
                log(f"cannot read ahead from a module the script imports: {error!r}")

    def visit(file, depth):
        found, relative = _top_level_imports(file)
        for entry in found:
            follow(_own_files(entry, own_dirs), depth + 1)
            if entry not in entries:
                entries.append(entry)
        follow(_relative_files(file, relative, own_dirs), depth + 1)

    visit(path, 0)
    return entries[:MAX_READ_AHEAD], read


def _importable_here(top, own_dirs, cache):
    """Whether top-level module `top` is one this process could import from its own sys.path
    and not the user's own (found in `own_dirs`: the script's directory, the stage's working
    directory, where another stage may have its own module of that name)."""
    if top not in cache:
        finder = importlib.machinery.PathFinder
        try:
            own = finder.find_spec(top, own_dirs) is not None
            found = top in sys.builtin_module_names or finder.find_spec(top, sys.path) is not None
        except (ImportError, ValueError):
            own, found = True, False
        cache[top] = found and not own
    return cache[top]


def _read_ahead(found, cwd, left_out):
    """`read_ahead` of the script `found` (`_script_of`'s answer for the command), with the
    files read: (named, entries, {file: identity}), or None."""
    if found is None:
        return None
    path, named, own_dir = found
    own_dirs = sorted({own_dir, os.path.realpath(cwd), cwd})
    try:
        entries, read = _imports_following_own(path, own_dirs)
    except Exception as error:  # noqa: BLE001 - a script it cannot read is one it does not read ahead
        log(f"cannot read ahead from {named}: {error!r}")
        return None
    cache = {}
    lacks = [
        e for e in entries
        if not _held(e)
        and not any(_within(e, name) for name in left_out)
        and all(part.isidentifier() for part in _entry_parts(e)[0].split("."))
        and _importable_here(e.split(".")[0].split(":")[0], own_dirs, cache)
    ]
    return named, lacks, read


def read_ahead(argv, cwd, left_out):
    """What this process lacks of what the script of command `argv` (run in `cwd`) imports at
    its top level, the user's own modules it imports read too (`_imports_following_own`): the
    entries it does not hold, could import from its own sys.path, that are not the user's own
    code, and not under a module of `left_out` (names). Returns (how the command names its
    script, entries), or None when the command runs no script it can read."""
    got = _read_ahead(_script_of(argv, cwd), cwd, left_out)
    return None if got is None else got[:2]


def _unchanged(read):
    """Whether every file of `read` ({path: identity}) is as it was."""
    return all(_identity(path) == identity for path, identity in read.items())


def lacks_for_fork(request, left_out):
    """In a serving zygote: the entries the script of fork `request` imports at its top level
    that this zygote lacks (see `read_ahead`), so that its next generation imports them.
    Told once per scan: a scan is cached per script and working directory until the script,
    or a user module read for it, changes on disk, and a later fork of that script is told
    nothing (orchestrate keeps what it was told, and the next generation imports it)."""
    argv, cwd = request.get("argv") or [], request.get("cwd") or "/"
    try:
        found = _script_of(argv, cwd)
        if found is None:
            return []
        cached = _SCANS.get((found[0], cwd))
        if cached is not None and _unchanged(cached):
            return []
        read = {found[0]: _identity(found[0])}
        got = _read_ahead(found, cwd, left_out)
    except Exception as error:  # noqa: BLE001 - never a reason to fail a fork
        log(f"cannot read ahead for a fork: {error!r}")
        return []
    lacks = got[1] if got else []
    _SCANS[(found[0], cwd)] = got[2] if got else read
    if lacks:
        log(f"a stage's script {got[0]} imports what generation {_GENERATION} lacks: {', '.join(lacks)}")
    return lacks


def plan_read_ahead(config):
    """`config` with what the script of the stage this zygote was started for imports at its
    top level (CONFIG's `read_ahead`: its `argv` and `cwd`) added after the learned modules,
    as `read_ahead` `{"script", "entries"}` (so that a restart reads nothing again)."""
    ask = config.get("read_ahead")
    if not isinstance(ask, dict) or "argv" not in ask:
        return config
    left_out = [entry["module"] for entry in config.get("left_out", [])]
    try:
        got = read_ahead(ask["argv"], ask.get("cwd") or "/", left_out)
    except Exception as error:  # noqa: BLE001 - never a reason to refuse
        log(f"cannot read ahead: {error!r}")
        got = None
    if not got:
        return dict(config, read_ahead=None)
    named, entries = got
    learned = list(config.get("learned", []))
    if entries:
        log(f"reading ahead from {named}: {', '.join(entries)}")
    return dict(config, learned=learned + [e for e in entries if e not in learned],
                read_ahead={"script": named, "entries": entries})


def read_ahead_held(config, needed):
    """The ready message's `read_ahead`: the script read ahead and which of its entries this
    zygote imported (`needed`: those not held after the plan's list), or None."""
    ahead = config.get("read_ahead")
    if not isinstance(ahead, dict) or "entries" not in ahead:
        return None
    held = [e for e in ahead["entries"] if e in needed and _held(e)]
    if held:
        log(f"read ahead from {ahead['script']}: {', '.join(held)}")
    return {"script": ahead["script"], "modules": held}


def serve(fd, config):
    """Imports the modules of `config`, then forks stages until end of file. Returns the argv of a stage
    in a forked stage process, None in the zygote when it is done."""
    sock = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    global _LOG, _GENERATION
    _LOG = config.get("log")
    _GENERATION = config.get("generation")
    if _LOG:
        try:
            os.makedirs(os.path.dirname(_LOG), exist_ok=True)
            if os.path.getsize(_LOG) > 1 << 20:
                os.truncate(_LOG, 0)  # kept short: the latest zygotes' lines are the useful ones
        except OSError:
            pass
    log(f"starting: {len(config.get('preload', []))} plan modules, {len(config.get('learned', []))} learned"
        + (f", checking one by one from {config.get('verified', 0)}" if config.get("check_each") else ""))
    config = plan_read_ahead(config)
    hold = NvmlHold(visible_gpus(config))
    hold.install()
    imported = preload(sock, config)
    hold.release()
    if imported is None:
        return None
    env_read, left_out, needed = imported
    ahead = imported_ahead_by_standbys(left_out)
    left_out_names = [entry["module"] for entry in left_out]
    recorded = LoadedFiles()
    log(f"ready: generation {_GENERATION}, {len(sys.modules)} modules loaded, {len(left_out)} learned modules left out"
        + ("" if recorded.fd is not None else "; no inotify watch: every fork stats them all"))
    send(sock, {
        "reply": "ready",
        "pid": os.getpid(),
        "threads": _os_threads(),
        "env_read": sorted(env_read),
        "left_out": left_out,
        "read_ahead": read_ahead_held(config, needed),
    })
    while True:
        try:
            got = receive(sock)
        except (OSError, ValueError, EOFError) as error:
            send(sock, {"reply": "failed", "error": f"unreadable request: {error}"})
            return None
        if got is None:
            return None
        request, fds = got
        refusal = unsafe_to_fork(recorded)
        if refusal:
            send(sock, refusal)
            return None
        try:
            role, value = fork_stage(request, fds, sock)
        except (OSError, ValueError, KeyError) as error:
            send(sock, {"reply": "failed", "error": str(error)})
            continue
        if role == "stage":
            recorded.close()
            if request.get("standby"):
                value = wait_for_stage(socket.socket(fileno=fds[2]), ahead, recorded)
            reseed_inherited_generators()
            to = os.environ.pop(config.get("imports_var", ""), None) if config.get("imports_var") else None
            if to:
                note_imports_at_exit(to, config.get("lineage", ""), set(sys.modules), list(sys.path))
            return value
        reply = {"reply": "forked", "pid": value}
        if config.get("imports_var") and not request.get("standby"):
            reply["lacks"] = lacks_for_fork(request, left_out_names)
        send(sock, reply)


def run_as_python(argv):
    """Runs `python script.py ARGS` or `python -m module ARGS` in this process."""
    if argv[1] == "-m":
        sys.argv = [argv[2]] + argv[3:]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        script = argv[1]
        sys.argv = argv[1:]
        sys.path.insert(0, os.path.dirname(os.path.realpath(script)))
        runpy.run_path(script, run_name="__main__")


def exit_status(stop):
    """The exit status `python script.py` ends with on SystemExit(code): None is 0, an int
    itself, anything else printed to stderr and 1."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code & 0xFF
    print(stop.code, file=sys.stderr)
    return 1


def run_stage(argv):
    """Runs the stage's script and returns the status it exits with, as `python script.py`
    would: 0 when it returns, SystemExit's code, 1 after an uncaught exception's traceback
    (printed by sys.excepthook). KeyboardInterrupt is left to the interpreter (it exits by
    SIGINT)."""
    try:
        run_as_python(argv)
        return 0
    except SystemExit as stop:
        return exit_status(stop)
    except KeyboardInterrupt:
        raise
    except BaseException:
        sys.excepthook(*sys.exc_info())
        return 1


def finish_stage(status):
    """Ends a forked stage the way the interpreter's own exit would, without its teardown of
    what the zygote imported: non-daemon threads joined, atexit handlers run, every file
    object the stage still holds flushed (open in its globals or a module's, or garbage in a
    cycle: flushed while all of its layers are open, which a collection does not promise),
    stdout and stderr flushed (a failed flush of a successful stage is status 120, as
    Python's), then `os._exit`. Skipped: the interpreter freeing every module and object it
    holds (and with them the `__del__` of objects still alive at exit, which Python does not
    promise either), which a forked child only gives back to the kernel anyway
    (bench/zygote/exit_probe.py and gpu_exit_probe.py measure what that costs)."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for thing in gc.get_objects():  # the frozen generation (the zygote's own) is not listed
        if isinstance(thing, _io._IOBase) and thing is not sys.stdout and thing is not sys.stderr:
            try:
                if not thing.closed and thing.writable():
                    thing.flush()
            except Exception:  # noqa: BLE001 - as at exit: a file that cannot flush loses its tail
                pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            if status == 0:
                status = 120
    os._exit(status)


def main():
    # `-c` put the zygote's working directory first on sys.path: preload from the
    # installed packages only; each stage gets its own sys.path[0].
    if sys.path and sys.path[0] == "" and not getattr(sys.flags, "safe_path", False):
        del sys.path[0]
    set_native_settings()
    argv = serve(int(sys.argv[1]), json.loads(sys.argv[2]))
    if argv is None:
        return
    finish_stage(run_stage(argv))


# `python -c SOURCE` runs it as __main__; importing it (it ships in the wheel) starts nothing.
if __name__ == "__main__":
    main()
