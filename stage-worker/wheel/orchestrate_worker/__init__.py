"""The `stage-worker` command of the `orchestrate-worker` wheel.

The wheel holds the built-in stage worker (the `stage-worker` binary beside this file) but no
libtorch: the binary uses the libraries of the torch 2.11.0 installed in this Python environment.
`main` finds torch's `lib/` folder without importing torch (importing it would cost seconds),
puts it first on `LD_LIBRARY_PATH` and replaces this process with the binary (`os.execve`), so
the worker keeps the pid `orchestrate` started, its arguments, its environment otherwise and its
open descriptors. Standard library only; Python 3.8 or later.
"""

import importlib.util
import os
import sys

#: The torch release the binary was linked against (tch 0.24 needs exactly libtorch 2.11.0).
TORCH_VERSION = "2.11.0"

#: The exit status when the worker cannot start, as the dynamic loader's own failure.
CANNOT_START = 127


def binary_path():
    """The real `stage-worker` binary, beside this module."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "stage-worker")


def torch_dir():
    """The installed torch package's folder, found as `import torch` would find it, without
    running it; None when this environment has no torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def torch_version(folder):
    """`torch.__version__` as torch/version.py records it (e.g. `2.11.0+cu130`), or None."""
    try:
        with open(os.path.join(folder, "version.py"), encoding="utf-8") as f:
            for line in f:
                if line.startswith("__version__"):
                    return line.split("=", 1)[1].strip().strip("'\"")
    except OSError:
        pass
    return None


def torch_lib_dir():
    """torch's `lib/` folder (libtorch_cpu.so, libc10.so, ...); exits with a message naming
    the fix when torch 2.11.0 is not installed in this environment."""
    folder = torch_dir()
    if folder is None:
        refuse("torch is not installed in this Python environment (%s)" % sys.prefix)
    version = torch_version(folder)
    if version is None or version.split("+")[0] != TORCH_VERSION:
        refuse("the torch in %s is %s, but this worker was built against libtorch %s"
               % (folder, version or "of unknown version", TORCH_VERSION))
    lib = os.path.join(folder, "lib")
    if not os.path.isfile(os.path.join(lib, "libtorch_cpu.so")):
        refuse("the torch in %s has no lib/libtorch_cpu.so" % folder)
    return lib


def refuse(reason):
    sys.stderr.write("stage-worker: %s: install it with `pip install torch==%s` into %s\n"
                     % (reason, TORCH_VERSION, sys.prefix))
    sys.exit(CANNOT_START)


def main():
    """Runs the binary in this process with torch's libraries on `LD_LIBRARY_PATH`."""
    env = dict(os.environ)
    lib = torch_lib_dir()
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = lib + (os.pathsep + old if old else "")
    binary = binary_path()
    try:
        os.execve(binary, [binary] + sys.argv[1:], env)
    except OSError as e:
        sys.stderr.write("stage-worker: cannot run %s: %s\n" % (binary, e))
        sys.exit(CANNOT_START)
