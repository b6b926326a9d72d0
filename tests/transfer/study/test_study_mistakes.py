"""`tools/study.py` with plausible mistakes, each in a real process: exit 2, one `error:` line,
no traceback, and nothing written (no run directory, no page, no docs/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import tiny_opts
from tests.helpers.analysis import make_fashion_mnist
from tests.helpers.mistakes import assert_user_error, run_tool, snapshot

# (what the user got wrong, arguments after the data overrides' options, a piece of the error)
MISTAKES = [
    # the linear probe holds out 100 references per class (x 10 classes) to choose its lr: a
    # --knn-train of 10 left 0 to train on (a ValueError traceback, after pretraining)
    ("probe budget of 0 iterations", ["--knn-train", "10"], "--knn-train 10: the linear probe"),
    ("knn-train of 1000 = all held out", ["--knn-train", "1000"], "give --knn-train > 1000"),
    ("unknown method", ["--methods", "lorac", "simclr", "--jobs", "1"], "--methods lorac simclr:"),
    ("sweep and experiment", ["--sweep", "beta", "--experiment", "in100-beta"], "--sweep beta"),
    ("ImageNet experiment here", ["--experiment", "in100-beta"], "--executor slurm"),
    ("repeated seeds", ["--seeds", "1", "1", "--jobs", "1"], "--seeds [1, 1]"),
    # --executor slurm: a request no cluster can satisfy is refused before anything is submitted
    ("zero nodes", ["--experiment", "in100-beta", "--dry-run", "--nodes", "0"], "--nodes must be"),
    ("--timeout 0", ["--executor", "slurm", "--timeout", "0"], "--timeout must be >= 1"),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("fmnist"), n_train=40, n_test=20)


@pytest.mark.parametrize("what,args,match", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_study_mistakes_are_one_error_line(tmp_path, data, what, args, match):
    out, results = tmp_path / "out", tmp_path / "docs" / "results.md"
    opts = tiny_opts(data, out, **{"DATASETS.TYPE": "fashion_mnist", "SOLVER.MAX_ITER": 2})
    before = snapshot(tmp_path)
    argv = ["tools/study.py", "--output-dir", str(out), "--results", str(results), *args, *opts]
    result = run_tool(argv, cwd=tmp_path)
    assert_user_error(result, before, tmp_path, match=match)


def test_slurm_executor_off_a_cluster_writes_nothing(tmp_path, data):
    """Without SLURM (no squeue on PATH) the study says so before it creates its directory."""
    out, results = tmp_path / "out", tmp_path / "docs" / "results.md"
    opts = tiny_opts(data, out, **{"DATASETS.TYPE": "fashion_mnist", "SOLVER.MAX_ITER": 2})
    before = snapshot(tmp_path)
    argv = ["tools/study.py", "--output-dir", str(out), "--results", str(results)]
    argv += ["--executor", "slurm", *opts]
    result = run_tool(argv, cwd=tmp_path, PATH=str(tmp_path / "no-slurm-here"))
    assert_user_error(result, before, tmp_path, match="cannot ask SLURM")
