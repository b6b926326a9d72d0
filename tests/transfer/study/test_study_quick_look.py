"""The study's first contact: a quick look (the example in `tools/study.py -h`) writes its page
under its output directory, never the committed docs/, and says, on the console and on its page,
when training ends before LORAC's prior turns on (then LORAC equals MoCo-M)."""

from __future__ import annotations

from tests.helpers import tiny_opts
from tests.helpers.analysis import exit_status, make_fashion_mnist, study_options
from transfer.cli.study import main as study_main


def test_a_quick_look_writes_under_its_output_dir_and_warns_that_the_prior_never_turned_on(
    tmp_path, monkeypatch, capsys
):
    """The -h quick look (no --output-dir, no --results, a short SOLVER.MAX_ITER) writes its page
    to output/study/results.md, never the committed docs/results.md and .png, and one line says
    that LORAC trained as MoCo-M (training ended before LOSS.BETA_INF_EPOCHS)."""
    # 1020 references: the probe holds out 100 per class to choose its lr and trains on the rest
    root = make_fashion_mnist(tmp_path / "fmnist", n_train=1020, n_test=20)
    monkeypatch.chdir(tmp_path)
    short = {"SOLVER.MAX_ITER": 2, "LOSS.BETA_INF_EPOCHS": 0.5, "INPUT.LARGE_SIZE": 16}
    opts = tiny_opts(root, tmp_path / "unused", **{"DATASETS.TYPE": "fashion_mnist", **short})
    argv = ["--seeds", "0", "--methods", "lorac", "mocom", "--knn-train", "1020", "--knn-test",
            "20", "--nuclear-images", "4", "--probe-epochs", "1", *opts]  # fmt: skip
    assert exit_status(study_main, argv) == 0
    assert not (tmp_path / "docs").exists()
    page = tmp_path / "output" / "study" / "results.md"
    assert page.is_file() and page.with_suffix(".png").is_file()
    # 1020 images / batch 8 = 127 iterations per epoch: beta = inf until iteration 64
    warning = (
        "training ends at iteration 2 (SOLVER.MAX_ITER / SOLVER.EPOCHS), before the prior turns "
        "on (LORAC at iteration 64, LOSS.BETA_INF_EPOCHS): those runs train with beta = inf "
        "throughout and equal MoCo-M"
    )
    log = (tmp_path / "output" / "study" / "log.txt").read_text()
    assert log.count(warning) == 1, log
    assert warning in capsys.readouterr().out
    # the page, which showed LORAC and MoCo-M with the same numbers and no word of why, names
    # the runs that trained as MoCo-M
    text = page.read_text()
    assert "## The prior never turned on" in text and "MoCo-M in all but name" in text
    assert (
        "- LORAC (seed 0): training ended at iteration 2; the prior would have turned on at "
        "iteration 64." in text.splitlines()
    )


def test_no_warning_when_the_prior_turns_on(tmp_path):
    from transfer.study.config import load_method_configs, prior_never_on

    root = make_fashion_mnist(tmp_path / "fmnist", n_train=40, n_test=20)
    for max_iter, warned in ((2, True), (3, False)):
        short = {"SOLVER.MAX_ITER": max_iter, "LOSS.BETA_INF_EPOCHS": 0.5}
        opt = study_options(root, tmp_path / "s", tmp_path / "r.md", overrides=short)
        assert bool(prior_never_on(opt, load_method_configs(opt))) is warned


def test_the_examples_of_the_help_parse_as_written():
    """The -h examples: `--methods lorac mocom SOLVER.MAX_ITER 20` took the overrides for methods
    (an error), `--seeds 0 1 2 SOLVER.EPOCHS 2.0` was not a list of seeds; `--` ends a list."""
    from transfer.cli.study import __doc__ as doc
    from transfer.cli.study import parse_args

    examples = {
        ln.split("#")[-1].strip(): ln.split("#")[0].split()[2:]  # after "python tools/study.py"
        for ln in doc.splitlines()
        if ln.strip().startswith("python tools/study.py") and "..." not in ln
    }
    assert len(examples) == 5, examples
    for argv in examples.values():
        parse_args(argv)  # SystemExit(2) on a command that does not parse
    sweep = parse_args(examples["Fig. 3: study-beta"])
    assert (sweep.seeds, sweep.opts) == ([0, 1, 2], ["SOLVER.EPOCHS", "2.0"])
    args = parse_args(examples["a quick look"])
    assert (args.methods, args.seeds, args.opts) == (
        ["lorac", "mocom"],
        [0],
        ["SOLVER.MAX_ITER", "20"],
    )
