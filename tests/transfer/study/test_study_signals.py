"""Stopping `make study` (tools/study.py) with Ctrl-C or `kill`: every run in progress saves a
checkpoint at its next iteration, the tool exits with status 128 + the signal and a one-line
message saying which runs resume, and no process goes on training after it has exited (before,
`kill` of the driver left its --jobs workers training and writing into the run directories)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, group_alive, tiny_opts
from tests.helpers.analysis import make_fashion_mnist
from transfer.study import StudyInterrupted, StudyOptions, driver, run_study


def _logged(metrics: Path) -> bool:
    return metrics.is_file() and metrics.stat().st_size > 0


@pytest.mark.parametrize(
    ("jobs", "sig", "to_group"),
    [
        # Ctrl-C in a terminal: the whole process group gets SIGINT
        pytest.param(2, signal.SIGINT, True, marks=pytest.mark.processes),
        # `kill <driver pid>`: the driver alone gets SIGTERM
        pytest.param(2, signal.SIGTERM, False, marks=pytest.mark.processes),
        (1, signal.SIGINT, True),
    ],
    ids=["jobs2-ctrl-c", "jobs2-kill-driver", "jobs1-ctrl-c"],
)
def test_a_stopped_study_saves_its_runs_and_leaves_no_process(tmp_path, jobs, sig, to_group):
    root = make_fashion_mnist(tmp_path / "fmnist", n_train=40, n_test=20)
    out = tmp_path / "study"
    overrides = {
        "DATASETS.TYPE": "fashion_mnist",
        "INPUT.LARGE_SIZE": 16,
        "SOLVER.MAX_ITER": 100_000,  # runs until stopped
        "SOLVER.CHECKPOINT_PERIOD": 100_000,  # no periodic checkpoint: the saved one is the stop's
        "DATALOADER.NUM_WORKERS": 1,  # as the demo config: a data-loader process per run
    }
    opts = tiny_opts(root, out, **overrides)
    seeds = ["0", "1"] if jobs > 1 else ["0"]
    cmd = [sys.executable, str(ROOT / "tools" / "study.py"), "--output-dir", str(out)]
    cmd += ["--results", str(tmp_path / "results.md"), "--methods", "mocom", "--seeds", *seeds]
    cmd += ["--jobs", str(jobs), *opts]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, start_new_session=True, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    runs = [out / f"mocom_seed{s}" for s in seeds]
    try:
        deadline = time.monotonic() + 120
        # every run has logged an iteration (detectron2 creates metrics.json before the first)
        while not all(_logged(r / "metrics.json") for r in runs):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the runs did not start training in 120 s"
            time.sleep(0.2)
        if to_group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    err = err.decode()
    assert proc.returncode == 128 + sig, err[-3000:]
    last = err.strip().splitlines()[-1]
    labels = ", ".join(f"MoCo-M seed {s}" for s in seeds)
    assert last == (
        f"study stopped by {sig.name}; runs that resume from their last checkpoint: {labels}. "
        "Run the same command again to go on."
    )
    for run in runs:
        saved = (run / "last_checkpoint").read_text().strip()
        assert saved.startswith("model_") and saved != "model_final.pth", saved
        assert (run / saved).is_file()
        assert not (run / "study.json").exists()
    deadline = time.monotonic() + 10  # orphans would be reaped by init: allow for that
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(proc.pid), "a process of the study outlived it"
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    time.sleep(1)
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_a_signal_in_a_runs_last_iteration_stops_before_the_next_run(tmp_path, monkeypatch):
    """The trainer lets a run whose last iteration saw the signal finish (nothing to save): the
    study must still stop before it starts another run (--jobs 1)."""
    root = make_fashion_mnist(tmp_path / "fmnist", n_train=40, n_test=20)
    started = []

    def finishing_run(cfg, run):
        started.append(run.seed)
        # as StopOnSignal during the last iteration: SIGTERM recorded, then the run ends normally
        previous = signal.signal(signal.SIGTERM, lambda *a: None)
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: the driver forwards it as a SIGTERM
        signal.signal(signal.SIGTERM, previous)
        return {}

    monkeypatch.setattr(driver, "pretrain_run", finishing_run)
    evaluated = {"knn_top1": 1.0, "linear_top1": 1.0, "nuclear_mean": 6.0}
    monkeypatch.setattr(driver, "evaluate_run", lambda cfg, run, opt: dict(evaluated))
    opt = StudyOptions(
        output_dir=str(tmp_path / "study"),
        results=str(tmp_path / "results.md"),
        seeds=(0, 1),
        methods=("mocom",),
        opts=tiny_opts(root, tmp_path / "study", **{"DATASETS.TYPE": "fashion_mnist"}),
    )
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(StudyInterrupted, match="stopped by SIGINT"):
        run_study(opt)
    assert started == [0]
    # the handlers of before restored (an xdist worker ignores SIGINT: not always Python's)
    assert {s: signal.getsignal(s) for s in handlers} == handlers
