"""Install detectron2's pure-Python package when no detectron2 is importable.

detectron2 is not on PyPI. The PyPI distribution ``sal-detectron2==0.7.2`` is a 2024 snapshot of
detectron2's main branch, but its wheel is tagged cp310 and carries a ``_C`` extension compiled for
Python 3.10 / torch 2.3 that cannot load elsewhere. This script downloads that wheel, removes
``detectron2/_C*.so`` and the wheel's stray top-level ``tools/`` package (it would shadow ours),
retags it ``py3-none-any`` and installs it with pip. The project never uses detectron2's compiled
ops, so nothing is lost. An official detectron2 that already imports is kept untouched.

Usage: python tools/install_detectron2.py [--force] [--wheel-dir DIR]

``--wheel-dir DIR`` writes the pure-Python wheel to DIR instead of installing it (``make
gpu-wheels``: a GPU machine without internet installs from there).
"""

# The one tool that is a standalone script rather than a console script of the package:
# `make venv` runs it before this project is installed, so it imports nothing from the project.

from __future__ import annotations

import argparse
import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DIST = "sal-detectron2==0.7.2"


def _installed() -> str | None:
    probe = "import detectron2, sys; sys.stdout.write(detectron2.__file__)"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def repack(src: Path, dst_dir: Path) -> Path:
    """Write a pure-Python ``py3-none-any`` copy of the sal-detectron2 wheel; return its path."""
    name, version = src.name.split("-")[:2]
    dst = dst_dir / f"{name}-{version}-py3-none-any.whl"
    records: list[str] = []
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = None
        for item in zin.infolist():
            n = item.filename
            if n.startswith("tools/") or (n.startswith("detectron2/_C") and n.endswith(".so")):
                continue
            if n.endswith(".dist-info/RECORD"):
                record_name = n
                continue
            data = zin.read(n)
            if n.endswith(".dist-info/WHEEL"):
                lines = [ln for ln in data.decode().splitlines() if not ln.startswith("Tag:")]
                lines = [
                    ln.replace("Root-Is-Purelib: false", "Root-Is-Purelib: true") for ln in lines
                ]
                lines += ["Tag: py3-none-any"]
                data = ("\n".join(lines) + "\n").encode()
            if n.endswith(".dist-info/top_level.txt"):
                data = b"detectron2\n"
            zout.writestr(n, data)
            records.append(_record_line(n, data))
        if record_name is None:
            raise RuntimeError(f"{src}: no RECORD in wheel")
        zout.writestr(record_name, "\n".join(records + [f"{record_name},,"]) + "\n")
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="reinstall even if detectron2 imports")
    ap.add_argument("--wheel-dir", help="write the pure-Python wheel here; install nothing")
    args = ap.parse_args()
    where = _installed()
    if where and not args.force and not args.wheel_dir:
        print(f"detectron2 already importable from {where}; keeping it")
        return 0
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            pip
            + [
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.10",
                "--platform",
                "any",
                "--platform",
                "manylinux2014_x86_64",
                "-d",
                tmp,
                DIST,
            ],
            check=True,
        )
        wheels = list(Path(tmp).glob("sal_detectron2-*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one sal-detectron2 wheel in {tmp}, found {wheels}")
        if args.wheel_dir:
            Path(args.wheel_dir).mkdir(parents=True, exist_ok=True)
            print(repack(wheels[0], Path(args.wheel_dir)))
            return 0
        pure = repack(wheels[0], Path(tmp))
        # fvcore and iopath are imported by detectron2 but missing from sal-detectron2's metadata.
        subprocess.run(
            pip + ["install", "setuptools<81", "fvcore", "iopath", str(pure)], check=True
        )
    where = _installed()
    if where is None:
        print(f"error: installed {DIST} but 'import detectron2' still fails", file=sys.stderr)
        return 1
    print(f"installed detectron2 (pure Python) from {DIST} at {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
