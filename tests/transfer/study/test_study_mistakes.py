"""`tools/study.py` with plausible mistakes: exit 2, one `error:` line, no traceback, and nothing
written (no run directory, no page, no docs/); with `--executor slurm` nothing submitted either (a
missing folder is found before SLURM is asked, not in a job after its wait in the queue).

The rows run the study's ``main`` in this process (:func:`run_main`), with the row's directory
as the working directory and its ``PATH`` set in ``os.environ``, which the study reads when it
looks for SLURM's commands; the row of :data:`IN_A_PROCESS` runs ``tools/study.py`` in a real
process, as a shell runs it.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from tests.helpers import tiny_opts
from tests.helpers.analysis import make_fashion_mnist
from tests.helpers.mistakes import assert_user_error, run_main, run_tool, snapshot
from transfer.cli.study import main as study_main
from transfer.study import StudyError, StudyOptions
from transfer.study.driver import check_same_settings

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
# the row that also shows the entry point, the one line and the exit status of a real process
IN_A_PROCESS = ["probe budget of 0 iterations"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("fmnist"), n_train=40, n_test=20)


@pytest.mark.parametrize("what,args,match", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_study_mistakes_are_one_error_line(tmp_path, data, monkeypatch, what, args, match):
    out, results = tmp_path / "out", tmp_path / "docs" / "results.md"
    opts = tiny_opts(data, out, **{"DATASETS.TYPE": "fashion_mnist", "SOLVER.MAX_ITER": 2})
    before = snapshot(tmp_path)
    argv = ["--output-dir", str(out), "--results", str(results), *args, *opts]
    if what in IN_A_PROCESS:
        result = run_tool(["tools/study.py", *argv], cwd=tmp_path)
    else:
        monkeypatch.chdir(tmp_path)
        result = run_main(study_main, argv)
    assert_user_error(result, before, tmp_path, match=match)


def test_slurm_executor_off_a_cluster_writes_nothing(tmp_path, data, monkeypatch):
    """Without SLURM (no squeue on PATH) the study says so before it creates its directory."""
    out, results = tmp_path / "out", tmp_path / "docs" / "results.md"
    opts = tiny_opts(data, out, **{"DATASETS.TYPE": "fashion_mnist", "SOLVER.MAX_ITER": 2})
    before = snapshot(tmp_path)
    argv = ["--output-dir", str(out), "--results", str(results), "--executor", "slurm", *opts]
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))
    monkeypatch.chdir(tmp_path)
    result = run_main(study_main, argv)
    assert_user_error(result, before, tmp_path, match="cannot ask SLURM")


def _fake_squeue(bin_dir: Path, body: str) -> str:
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text("#!/bin/sh\n" + body)
    (bin_dir / "squeue").chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory) -> Path:
    """An ImageNet-style root (class folders, no images: only the folders are looked at before
    a submission) with ``train/`` holding both classes of ``classes.txt`` and ``val/`` one."""
    root = tmp_path_factory.mktemp("imagenet")
    for folder in ("train/n01", "train/n02", "val/n01", "probe/train/n01", "probe/train/n02"):
        (root / folder).mkdir(parents=True)
    (root / "classes.txt").write_text("n01\nn02\n")
    return root


# (what the user got wrong, overrides after the experiment's, a piece of the error); every row is
# `--experiment in100-beta --executor slurm` with DATASETS.ROOT <imagenet>/train
DATA_MISTAKES = [
    ("class list not there", {"DATASETS.CLASS_LIST": "{root}/nope.txt"},
     "DATASETS.CLASS_LIST: {root}/nope.txt: no such class-list file"),
    # the configs' imagenet100 list against a root without those classes (a copy of another set)
    ("classes of imagenet100 missing", {}, "{root}/train: 100 classes of the class list have no"),
    ("class missing from the kNN's val/", {"DATASETS.CLASS_LIST": "{root}/classes.txt"},
     "{root}/val: 1 classes of the class list have no folder, e.g. ['n02']"),
    # the linear probe reads train/ and val/ beside DATASETS.ROOT: val/ is not there
    ("no val/ for the probe", {"DATASETS.ROOT": "{root}/probe/train", "TEST.KNN_PERIOD": 0,
     "DATASETS.CLASS_LIST": "{root}/classes.txt"}, "{root}/probe/val: no such directory"),
]  # fmt: skip


@pytest.mark.parametrize("what,overrides,match", DATA_MISTAKES, ids=[m[0] for m in DATA_MISTAKES])
def test_an_experiments_data_is_checked_before_anything_is_submitted(
    tmp_path, imagenet, monkeypatch, what, overrides, match
):
    """Each run's pretraining data (root, class list, the kNN monitor's train/ and val/) and its
    probe's: a missing file or folder was found by the job on a node after its queue wait."""
    out = tmp_path / "out"
    given = {"DATASETS.ROOT": "{root}/train", "TEST.KNN_ROOT": "{root}", **overrides}
    opts = [str(x).format(root=imagenet) for kv in given.items() for x in kv]
    # an squeue that fails the test if SLURM is asked at all
    monkeypatch.setenv("PATH", _fake_squeue(tmp_path / "bin", "echo squeue asked; exit 3\n"))
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    argv = ["--experiment", "in100-beta", "--seeds", "0", "--methods", "lorac_beta1",
            "--output-dir", str(out), "--executor", "slurm", *opts]  # fmt: skip
    result = run_main(study_main, argv)
    assert_user_error(result, before, tmp_path, match=match.format(root=imagenet))
    assert "squeue asked" not in result.output


def test_slurm_down_says_what_slurm_says(tmp_path, data, monkeypatch):
    """squeue failing (the controller down) gave `... returned non-zero exit status 1`; the one
    line now carries SLURM's own reason."""
    out, results = tmp_path / "out", tmp_path / "docs" / "results.md"
    opts = tiny_opts(data, out, **{"DATASETS.TYPE": "fashion_mnist", "SOLVER.MAX_ITER": 2})
    down = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"
    monkeypatch.setenv("PATH", _fake_squeue(tmp_path / "bin", f"echo '{down}' >&2; exit 1\n"))
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    argv = ["--output-dir", str(out), "--results", str(results), "--executor", "slurm", *opts]
    result = run_main(study_main, argv)
    assert_user_error(result, before, tmp_path, match=f"squeue exited with status 1: {down}")


def _finished_run(out: Path, method: str, seed: int, opt: StudyOptions) -> Path:
    """A finished study run as a study with ``opt`` leaves it (its study.json), from files."""
    run = out / f"{method}_seed{seed}"
    run.mkdir(parents=True)
    result = {"method": method, "seed": seed, "overrides": opt.overrides(method)}
    (run / "study.json").write_text(json.dumps({**result, "eval_settings": opt.eval_settings()}))
    return run


def test_study_rerun_with_other_overrides_is_refused(tmp_path, data, monkeypatch):
    """A study run again into its folder with another budget (SOLVER.MAX_ITER 3, not 2) is
    refused, naming the difference; it reused the old runs and its page mixed the budgets."""
    out, results = tmp_path / "out", tmp_path / "docs" / "results.md"
    opts = tiny_opts(data, out, **{"DATASETS.TYPE": "fashion_mnist", "SOLVER.MAX_ITER": 2})
    before_opts = tiny_opts(data, out, **{"DATASETS.TYPE": "fashion_mnist", "SOLVER.MAX_ITER": 3})
    _finished_run(out, "lorac", 0, StudyOptions(opts=before_opts))
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["--output-dir", str(out), "--results", str(results), "--seeds", "0", "--methods",
            "lorac", "--jobs", "1", "--", *opts]  # fmt: skip
    result = run_main(study_main, argv)
    assert_user_error(result, before, tmp_path, match="SOLVER.MAX_ITER 3 (now 2)")
    assert "another --output-dir" in result.output


def test_same_settings_resume_and_other_settings_are_named(tmp_path):
    """The check the study makes before it runs: the settings a finished run was made with pass
    (the study skips it, as before); another override or evaluation setting is named."""
    opt = StudyOptions(output_dir=str(tmp_path), methods=("lorac",), seeds=(0,),
                       opts=("SOLVER.MAX_ITER", "20"))  # fmt: skip
    _finished_run(tmp_path, "lorac", 0, opt)
    check_same_settings(opt, {})
    for other, named in (
        (replace(opt, opts=("SOLVER.MAX_ITER", "40")), "SOLVER.MAX_ITER 20 (now 40)"),
        (replace(opt, knn_train=500), "knn_train 10000 (now 500)"),
        (replace(opt, opts=()), "SOLVER.MAX_ITER 20 (now not set)"),
    ):
        with pytest.raises(StudyError, match=re.escape(named)):
            check_same_settings(other, {})
