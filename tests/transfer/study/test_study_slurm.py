"""`tools/study.py --executor slurm` on the real two-node test cluster (`make test-slurm`): a
2-value beta sweep x 1 seed with tiny budgets, from one command to its page.

A second invocation while the jobs run submits nothing; cancelling one run's pretraining job
(SLURM then cancels its evaluation) makes the next invocation resubmit that run only, and the
`--status` line it prints runs as printed; the finished page and records equal those of a local
run of the same experiment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import tiny_opts
from tests.helpers.analysis import exit_status, make_fashion_mnist
from tests.helpers.mistakes import REPO
from tests.slurm.jobtools import wait_for_job
from transfer.cli.study import main as study_main

pytestmark = pytest.mark.slurm
METHODS = ["lorac_beta1", "lorac_beta2"]
NUMBERS = ("knn_top1", "linear_top1", "nuclear_mean", "max_iter", "train_images", "probe_lr")


def _argv(data: Path, out: Path, *extra: str) -> list[str]:
    # the sweep's warm-up is half of SOLVER.EPOCHS: 0.015 epoch of 127 iterations (2), then the
    # prior for the last 2 of SOLVER.MAX_ITER 4
    opts = tiny_opts(data, out, **{"DATASETS.TYPE": "fashion_mnist", "INPUT.LARGE_SIZE": 16,
                                   "SOLVER.MAX_ITER": 4, "SOLVER.EPOCHS": 0.03})  # fmt: skip
    return ["--experiment", "study-beta", "--output-dir", str(out), "--seeds", "0",
            "--knn-train", "1020", "--knn-test", "20", "--nuclear-images", "4", "--probe-epochs",
            "1", "--methods", *METHODS, "--jobs", "1", *extra, *opts]  # fmt: skip


def _study(argv: list[str], capsys) -> str:
    assert exit_status(study_main, argv) == 0
    return capsys.readouterr().out


def _queued(job_ids: list[str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    return [j for j in job_ids if j in out.split()]


def _wait_gone(job_ids: list[str], timeout_s: float) -> None:
    end = time.time() + timeout_s
    while _queued(job_ids):
        assert time.time() < end, f"jobs {_queued(job_ids)} still queued"
        time.sleep(1)


def _submitted(printed: str) -> dict[str, dict[str, str]]:
    """``{method: {"pretrain": job id, "evaluate": job id}}`` of the runs submitted, as said."""
    found = re.findall(r"(\S+)_seed0: .*: pretrain job (\d+), evaluate job (\d+)", printed)
    return {m: {"pretrain": pre, "evaluate": ev} for m, pre, ev in found}


def _job_folders(out: Path) -> list[str]:
    """Every job submitit submitted for the runs: ``<run>/submitit[/evaluate]/<job id>``."""
    return sorted(str(p.parent.relative_to(out)) for p in out.glob("*/**/*_submitted.pkl"))


def _records(out: Path) -> dict[str, dict]:
    return {m: json.loads((out / f"{m}_seed0" / "study.json").read_text()) for m in METHODS}


def _tables(page: str) -> list[str]:
    """The page's table rows and findings, without what depends on the invocation (time,
    machine, command, budget)."""
    keep, skip, per_seed = [], False, False
    for line in page.splitlines():
        if line.startswith("## "):
            skip = line.startswith(("## Command", "## Budget", "## Hardware"))
            per_seed = line == "## Per seed"
        if per_seed and line.startswith("|"):  # its last three columns are times and speeds
            line = "|".join(line.split("|")[:-4])
        if not skip and not line.startswith("Generated "):
            keep.append(line)
    return keep


def _the_printed_status_line_runs(printed: str, jobs: dict[str, dict]) -> None:
    """The `--status` line the submission ends with, run as printed (by a shell, from the
    repository, `python` the test's interpreter): exit 0 and a table with each run's job (it
    failed: `--status` came after the overrides, which took it for one)."""
    line = re.search(r"`(python tools/study\.py .*)` shows them", printed)[1]
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    result = subprocess.run(line, shell=True, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {
        cells[0]: cells[1:]
        for ln in result.stdout.splitlines()
        if ln.startswith("|") and (cells := [c.strip() for c in ln.strip("|").split("|")])
    }
    assert rows["run"] == ["state", "job id", "iteration", "last metric"], result.stdout
    for m in METHODS:  # queued, running or already done, by its own jobs
        state, job = rows[f"{m}_seed0"][:2]
        assert re.fullmatch(r"(pretraining|evaluation): [A-Z_]+|done", state), rows
        assert job in (jobs[m]["pretrain"], jobs[m]["evaluate"]), rows


def test_a_beta_sweep_through_slurm_submits_once_resubmits_a_killed_run_and_writes_its_page(
    cluster, tmp_path, capsys
):
    # 1020 references: the linear probe holds out 100 per class to choose its lr
    data = make_fashion_mnist(tmp_path / "fm", n_train=1020, n_test=20)
    out, page = tmp_path / "slurm", tmp_path / "slurm" / "results.md"
    argv = _argv(data, out, "--executor", "slurm", "--partition", "debug", "--timeout", "20")

    first = _study(argv, capsys)
    assert first.count(": submitted: pretrain job") == 2, first
    jobs = _submitted(first)
    killed, kept = jobs["lorac_beta2"], jobs["lorac_beta1"]
    folders = _job_folders(out)  # each run's jobs in its own submitit folders
    where = {"pretrain": "submitit", "evaluate": "submitit/evaluate"}
    assert folders == sorted(f"{m}_seed0/{where[k]}/{j[k]}" for m, j in jobs.items() for k in where)

    second = _study(argv, capsys)  # at once, while the jobs are queued or running
    assert "0 run(s) submitted now, 2 already queued" in second, second
    assert second.count("left alone") == 2
    assert _job_folders(out) == folders

    subprocess.run(["scancel", killed["pretrain"]], check=True)
    _wait_gone([killed["pretrain"], killed["evaluate"]], 120)  # its evaluation: invalid dep.
    assert wait_for_job(kept["evaluate"], timeout_s=600) == "COMPLETED"

    third = _study(argv, capsys)
    assert "lorac_beta1_seed0: done" in third
    assert re.search(rf"lorac_beta2_seed0: job {killed['pretrain']} failed \(log .*\): "
                     "resubmitted: pretrain job \\d+, evaluate job \\d+", third), third  # fmt: skip
    assert "1 run(s) submitted now" in third
    again = _submitted(third)["lorac_beta2"]
    assert again["pretrain"] != killed["pretrain"]
    # written after the resubmission: the missing run is named with its new job, as queued
    partial = page.read_text()
    assert "## Missing runs (1)" in partial
    assert re.search(rf"\(`lorac_beta2_seed0`\): pretraining: [A-Z]+ \(job {again['pretrain']}\)",
                     partial), partial  # fmt: skip
    _the_printed_status_line_runs(third, {"lorac_beta1": kept, "lorac_beta2": again})
    assert wait_for_job(again["evaluate"], timeout_s=600) == "COMPLETED"

    # the last evaluation job wrote the page; running the command again collects, submits nothing
    assert "Missing runs" not in page.read_text()
    fourth = _study(argv, capsys)
    assert "0 run(s) submitted now, 0 already queued" in fourth

    local = tmp_path / "local"
    _study(_argv(data, local), capsys)
    slurm_runs, local_runs = _records(out), _records(local)
    for m in METHODS:
        for key in NUMBERS:
            assert slurm_runs[m][key] == local_runs[m][key], (m, key)
    assert _tables(page.read_text()) == _tables((local / "results.md").read_text())
