"""`make study`'s code path on generated Fashion-MNIST idx files and a few iterations: every run
is pretrained and evaluated, the report and plot hold the runs' numbers, a second invocation
skips finished runs, a lost study.json is re-evaluated without training and an interrupted run
resumes from its last checkpoint."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from pretrain.config.defaults import load_config
from tests.helpers.analysis import (
    assert_png_not_blank,
    exit_status,
    make_fashion_mnist,
    study_options,
)
from transfer.cli.study import main as study_main
from transfer.study import METHODS, Method, StudyError, StudyOptions, run_study


def _mtimes(out: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(out.glob("*_seed*/model_*.pth"))}


def test_study_runs_reports_and_resumes(tmp_path):
    root = make_fashion_mnist(tmp_path / "fmnist", n_train=40, n_test=20)
    out, results = tmp_path / "study", tmp_path / "docs" / "results.md"
    opt = study_options(root, out, results)

    first = run_study(opt)
    assert [(o.method, o.seed, o.status) for o in first] == [
        (m, s, "done") for m in ("lorac", "mocom", "mocov2") for s in (0, 1)
    ]
    runs = {
        (o.method, o.seed): json.loads(
            (out / f"{o.method}_seed{o.seed}" / "study.json").read_text()
        )
        for o in first
    }
    for (method, seed), r in runs.items():
        assert (r["method"], r["seed"], r["max_iter"]) == (method, seed, 2)
        assert 0 <= r["knn_top1"] <= 100 and 0 <= r["linear_top1"] <= 100
        # ||Q_hat||_* of 32 unit vectors lies in [sqrt(32), sqrt(32 * rank)]
        assert np.sqrt(32) - 1e-3 <= r["nuclear_mean"] <= 32, r["nuclear_mean"]
        assert r["nuclear_count"] == 4 and r["probe_iters"] >= 1
        # the probe's lr was chosen among 7 on held-out references, then retrained on all 40
        assert len(r["probe_val_top1"]) == 7 and r["probe_train_images"] == 40
    assert runs[("mocov2", 0)]["views"] == 2 and runs[("lorac", 0)]["views"] == 3

    md = results.read_text()
    for method, label in (("lorac", "LORAC"), ("mocom", "MoCo-M"), ("mocov2", "MoCo-v2")):
        cells = []
        for key, digits in (("knn_top1", 2), ("linear_top1", 2), ("nuclear_mean", 3)):
            v = [runs[(method, s)][key] for s in (0, 1)]
            cells.append(f"{np.mean(v):.{digits}f} ± {np.std(v, ddof=1):.{digits}f}")
        row = f"| {label} | 2 | {' | '.join(cells)} |"
        assert row in md.splitlines(), f"no summary row {row!r} in\n{md}"
        assert len(re.findall(rf"^\| {re.escape(label)} \| [01] \| \d+\.\d\d \|", md, re.M)) == 2
    assert "sample standard deviation" in md and "ddof = 1" in md
    assert "python tools/study.py (test)" in md and "CPU model" in md and "images/s" in md
    assert re.search(r"LORAC's mean is \d+\.\d\d points (above|below) MoCo-M's", md)
    png = results.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_png_not_blank(png)
    log = (out / "log.txt").read_text()
    assert "[1/6] LORAC seed 0: pretraining" in log and "ETA unknown" in log
    assert re.search(r"\[2/6\] LORAC seed 1: pretraining .*5 run\(s\) left, ETA \d", log)

    # Again: nothing is trained or evaluated, the report is rewritten from the study.json files.
    before = _mtimes(out)
    results.unlink()
    second = run_study(opt)
    assert {o.status for o in second} == {"skipped"}
    assert _mtimes(out) == before and results.is_file()
    assert "[6/6] MoCo-v2 seed 1: skipped" in (out / "log.txt").read_text()

    # A lost study.json: evaluated again from the final checkpoint, not retrained.
    (out / "lorac_seed1" / "study.json").unlink()
    metrics_before = (out / "lorac_seed1" / "metrics.json").read_text()
    third = run_study(opt)
    assert [(o.method, o.seed) for o in third if o.status == "done"] == [("lorac", 1)]
    assert _mtimes(out) == before
    assert (out / "lorac_seed1" / "metrics.json").read_text() == metrics_before
    again = next(o.result for o in third if o.status == "done")
    for key in ("knn_top1", "linear_top1", "nuclear_mean", "train_seconds"):
        assert again[key] == pytest.approx(runs[("lorac", 1)][key]), key


def test_an_interrupted_run_resumes_from_its_last_checkpoint(tmp_path):
    root = make_fashion_mnist(tmp_path / "fmnist", n_train=40, n_test=20)
    out = tmp_path / "study"
    opt = study_options(
        root,
        out,
        tmp_path / "results.md",
        overrides={"SOLVER.CHECKPOINT_PERIOD": 1},  # keeps model_0000000.pth
        methods=("mocom",),
        seeds=(0,),
    )
    run_study(opt)
    # As if killed after the first checkpoint: no model_final, no study.json.
    run = out / "mocom_seed0"
    for name in ("study.json", "train_stats.json", "model_final.pth"):
        (run / name).unlink()
    (run / "last_checkpoint").write_text("model_0000000.pth")
    (outcome,) = run_study(opt)
    assert outcome.status == "done" and outcome.result["resumed_from_iter"] == 1
    assert (run / "model_final.pth").is_file() and (run / "study.json").is_file()
    assert "(resumed at it. 1)" in (tmp_path / "results.md").read_text()


def test_study_errors_are_one_line_and_exit_2(tmp_path, capsys):
    root = make_fashion_mnist(tmp_path / "fmnist")
    base = ["--output-dir", str(tmp_path / "out"), "--results", str(tmp_path / "r.md")]
    assert exit_status(study_main, [*base, "--methods", "lorac", "simclr"]) == 2
    assert "error: --methods lorac simclr: choose from" in capsys.readouterr().err
    assert exit_status(study_main, [*base, "DATASETS.ROOT", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "DATASETS.ROOT" in err and err.count("\n") == 1
    assert exit_status(study_main, [*base, "SOLVER.NO_SUCH_KEY", "1"]) == 2
    assert "NO_SUCH_KEY" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran

    longer = tmp_path / "longer.yaml"
    longer.write_text(f'_BASE_: "{METHODS["mocom"].config}"\nSOLVER:\n  EPOCHS: 2.0\n')
    opt = StudyOptions(
        output_dir=str(tmp_path / "out"),
        methods=("lorac", "longer"),
        opts=["DATASETS.ROOT", str(root)],
        method_table={**METHODS, "longer": Method("MoCo-M 2 ep", str(longer))},
    )
    demo_epochs = f"{load_config(METHODS['lorac'].config).SOLVER.EPOCHS:g}"
    with pytest.raises(
        StudyError,
        match=rf"SOLVER.EPOCHS .* differ .*lorac: EPOCHS {demo_epochs}, .*longer: EPOCHS 2,",
    ):
        run_study(opt)


@pytest.mark.processes  # make test-processes
def test_jobs_run_in_parallel_processes_and_match_sequential_runs(tmp_path):
    """--jobs 2: two runs at once in their own processes, with the same numbers as one by one
    (runs are seeded and single-threaded in both cases)."""
    root = make_fashion_mnist(tmp_path / "fmnist", n_train=40, n_test=20)
    seq = study_options(root, tmp_path / "seq", tmp_path / "seq.md", methods=("mocom",))
    par = study_options(root, tmp_path / "par", tmp_path / "par.md", methods=("mocom",))
    par.jobs = 2
    one = run_study(seq)
    two = run_study(par)
    assert [(o.seed, o.status) for o in two] == [(0, "done"), (1, "done")]
    for a, b in zip(one, two, strict=True):
        for key in ("knn_top1", "linear_top1", "nuclear_mean"):
            assert b.result[key] == pytest.approx(a.result[key], abs=1e-6), key
    assert "Runs at once (`--jobs`): 2" in (tmp_path / "par.md").read_text()
    assert "ETA" in (tmp_path / "par" / "log.txt").read_text()


def test_a_second_study_on_the_same_directory_is_refused(tmp_path, capsys):
    """Two studies on one --output-dir would train the same runs into the same files."""
    import fcntl

    root = make_fashion_mnist(tmp_path / "fmnist", n_train=40, n_test=20)
    out = tmp_path / "study"
    opt = study_options(root, out, tmp_path / "results.md", methods=("mocom",), seeds=(0,))
    out.mkdir()
    lock = out / ".study.lock"
    with open(lock, "w") as held:  # as a running study holds it
        held.write("pid 4242 on somewhere\n")
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(StudyError, match=r"another study is running there \(pid 4242 on some"):
            run_study(opt)
        argv = ["--output-dir", str(out), "--results", str(tmp_path / "r.md"), *opt.opts]
        assert exit_status(study_main, argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --output-dir {out}: another study") and err.count("\n") == 1
    assert not (out / "mocom_seed0").exists()  # nothing ran
    (outcome,) = run_study(opt)  # released: the study runs, and names itself in the lock file
    assert outcome.status == "done"
    assert lock.read_text().startswith(f"pid {os.getpid()} on ")
