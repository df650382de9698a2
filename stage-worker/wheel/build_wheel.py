"""Assembles the `orchestrate-worker` wheel from a built `stage-worker` binary (already stripped
and with its RUNPATH set by scripts/build-worker-wheel) and the launcher package beside this
file. Standard library only.

    python3 build_wheel.py --binary PATH --version 0.1.0 --tag manylinux_2_34_x86_64 --out dist

The wheel: `orchestrate_worker/__init__.py` (the launcher), `orchestrate_worker/stage-worker`
(the binary, executable), and a `stage-worker` console script that runs the launcher. Its
metadata requires `torch==2.11.0`, whose libraries the binary uses. Prints the wheel's path.
"""

import argparse
import base64
import hashlib
import os
import zipfile

NAME = "orchestrate_worker"
SUMMARY = ("The built-in stage worker of orchestrate (stage-worker), running on the libtorch "
           "of the torch 2.11.0 installed beside it.")


def metadata(version):
    return "".join([
        "Metadata-Version: 2.1\n",
        "Name: orchestrate-worker\n",
        "Version: %s\n" % version,
        "Summary: %s\n" % SUMMARY,
        "License: MIT OR Apache-2.0\n",
        "Requires-Python: >=3.8\n",
        "Requires-Dist: torch==2.11.0\n",
    ])


def wheel_file(tag):
    return ("Wheel-Version: 1.0\nGenerator: orchestrate scripts/build-worker-wheel\n"
            "Root-Is-Purelib: false\nTag: py3-none-%s\n" % tag)


ENTRY_POINTS = "[console_scripts]\nstage-worker = orchestrate_worker:main\n"


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d\n" % (name, digest, len(data))


def add(zf, name, data, executable=False):
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = ((0o755 if executable else 0o644) | 0o100000) << 16
    zf.writestr(info, data)


def build(binary, version, tag, out):
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, NAME, "__init__.py"), "rb") as f:
        launcher = f.read()
    with open(binary, "rb") as f:
        worker = f.read()
    info = "%s-%s.dist-info" % (NAME, version)
    files = [
        ("%s/__init__.py" % NAME, launcher, False),
        ("%s/stage-worker" % NAME, worker, True),
        ("%s/METADATA" % info, metadata(version).encode(), False),
        ("%s/WHEEL" % info, wheel_file(tag).encode(), False),
        ("%s/entry_points.txt" % info, ENTRY_POINTS.encode(), False),
    ]
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "%s-%s-py3-none-%s.whl" % (NAME, version, tag))
    record = "".join(record_line(n, d) for n, d, _ in files) + "%s/RECORD,,\n" % info
    with zipfile.ZipFile(path, "w") as zf:
        for name, data, executable in files:
            add(zf, name, data, executable)
        add(zf, "%s/RECORD" % info, record.encode())
    return path


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    print(build(a.binary, a.version, a.tag, a.out))


if __name__ == "__main__":
    main()
