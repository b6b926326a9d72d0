"""The Makefile's device-check recipe tells the truth without a GPU to run it on.

``make gpu-check`` runs with a stand-in interpreter (``GPU_PY``): a script that answers the
recipe's probes (Python version, CUDA visible, packages importable) and plays pytest and the
benchmarks with the exit status the test asks for. The recipes pipe each through ``tee``, whose
own status must not hide a failure (``pipefail``). ``make test``'s pytest command is read from a
dry run (``make -n``).
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

FAKE = """#!/bin/bash
# the recipe's probes: python -c "..." (version, CUDA, imports)
if [ "$1" = -c ]; then
  case "$2" in *version_info*) exit "${FAKE_VERSION_RC:-0}";; *cuda*) exit "${FAKE_CUDA_RC:-0}";;
  *platform*) echo 3.9.2;; esac
  exit 0
fi
if [ "$1" = -m ] && [ "$2" = pytest ]; then echo "fake pytest ran"; exit "${FAKE_PYTEST_RC:-0}"; fi
if [ "$1" = -m ]; then
  echo "{\\"bench\\": \\"$2\\", \\"args\\": \\"${*:3}\\"}"; exit "${FAKE_BENCH_RC:-0}"
fi
exit 0
"""


def _make(tmp_path: Path, target: str = "gpu-check", **env: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "gpu_check"
    cmd = ["make", "-s", "-C", str(ROOT), target, f"GPU_PY={fake}", f"GPU_OUT={out}"]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_device_check_passes_when_everything_passes(tmp_path):
    r = _make(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fake pytest ran" in (tmp_path / "gpu_check" / "tests.txt").read_text()
    assert (tmp_path / "gpu_check" / "costs.txt").exists()
    # the throughput ratio: one process for both batches (the stand-in echoes the module it ran)
    ratio = (tmp_path / "gpu_check" / "throughput.txt").read_text()
    assert ratio.count("benchmarks.bench_throughput") == 1 and "--batch 32 64 " in ratio
    for b in (32, 64):  # the compiled step: one command per batch size
        assert "--switch" in (tmp_path / "gpu_check" / f"throughput_compiled_{b}.txt").read_text()


def test_the_quick_check_runs_its_one_script(tmp_path):
    r = _make(tmp_path, "gpu-quick")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "benchmarks.gpu_quick" in (tmp_path / "gpu_check" / "quick.txt").read_text()


@pytest.mark.parametrize("failing", ["FAKE_PYTEST_RC", "FAKE_BENCH_RC"])
def test_device_check_fails_when_a_test_or_benchmark_fails(tmp_path, failing):
    r = _make(tmp_path, **{failing: "1"})
    assert r.returncode != 0, r.stdout + r.stderr
    # the figures are still written and the tests' output is kept
    assert (tmp_path / "gpu_check" / "tests.txt").exists()
    assert (tmp_path / "gpu_check" / "costs.txt").exists()


@pytest.mark.parametrize(
    ("env", "says"),
    [({"FAKE_CUDA_RC": "2"}, "no CUDA device"), ({"FAKE_VERSION_RC": "2"}, "3.10 to 3.12")],
)
def test_device_check_refuses_in_one_error_line(tmp_path, env, says):
    r = _make(tmp_path, **env)
    assert r.returncode != 0
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and says in errors[0], r.stdout + r.stderr
    assert not (tmp_path / "gpu_check" / "tests.txt").exists()


def test_make_test_runs_two_workers_and_names_the_slowest_tests(tmp_path):
    """``make test``: pytest on two xdist workers (installed by the ``dev`` extra), the compile and
    several-process tests left to their own targets (CI runs them), each test module whole on one
    worker (its module-scoped fixtures run once), the 25 slowest tests after
    the summary; ``PYTEST_ARGS`` comes after them, so ``PYTEST_ARGS="-n 0"`` runs one process."""
    stamp = tmp_path / "installed"  # newer than setup.py: no venv install in the dry run
    stamp.touch()
    cmd = ["make", "-n", "-C", str(ROOT), "test", f"VENV_STAMP={stamp}", "PYTEST_ARGS=-n 0 -x"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    [line] = [x for x in r.stdout.replace("\\\n", " ").splitlines() if "-m pytest" in x]
    argv = shlex.split(line)
    assert argv[argv.index("-m") + 1 :][:4] == [
        "pytest",
        "-q",
        "-m",
        "not compile and not processes and not protocols",
    ]
    # what make test leaves out, CI runs: each left-out marker has its target in .ci/run
    ci = (ROOT / ".ci" / "run").read_text().split()
    assert {"test-compile", "test-processes", "test-protocols"} <= set(ci)
    workers = [argv[i + 1] for i, a in enumerate(argv) if a == "-n"]
    assert workers == ["2", "0"], argv  # make's default, then PYTEST_ARGS's (the last one wins)
    assert argv[argv.index("--dist") + 1] == "loadfile" and "--durations=25" in argv
    assert argv[-3:] == ["0", "-x", "tests"]
    assert re.search(r'"dev": \[[^]]*"pytest-xdist', (ROOT / "setup.py").read_text())


def test_the_oldest_torch_runs_its_checks_from_beside_the_venv(tmp_path):
    """``make test-oldest-torch``: the oldest torch setup.py allows, installed without
    dependencies into the ignored .oldest-torch/ and put before the venv's on the path, runs the
    quick check's toy, SyncBN's processes and the compile checks; CI runs it."""
    stamp = tmp_path / "installed"
    stamp.touch()
    cmd = ["make", "-n", "-C", str(ROOT), "test-oldest-torch", f"VENV_STAMP={stamp}"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.replace("\\\n", " ").splitlines()
    minimum = re.search(r'"torch>=([\d.]+)"', (ROOT / "setup.py").read_text()).group(1)
    if not (ROOT / ".oldest-torch").exists():  # installed once, then kept
        [install] = [x for x in lines if "pip install" in x and "--target" in x]
        assert "--no-deps" in install and "--target .oldest-torch " in install
        assert f"torch=={minimum}.0" in install.split()
    [run] = [x for x in lines if "-m pytest" in x]
    assert f"PYTHONPATH={ROOT}/.oldest-torch:{ROOT} " in run
    for tests in ("test_gpu_scripts_at_toy_size.py", "test_norm.py", "test_compiled_configs.py"):
        assert tests in run
    assert "/.oldest-torch/" in (ROOT / ".gitignore").read_text().split()
    assert "test-oldest-torch" in (ROOT / ".ci" / "run").read_text().split()
