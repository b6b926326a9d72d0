"""Options after the trailing ``KEY VALUE`` overrides: every tool that takes overrides reads its
own options wherever they are on the line. ``... SOLVER.MAX_ITER 3 --resume`` resumes instead of
reading ``--resume`` as an override (an "overrides must be KEY VALUE pairs" or "Non-existent key:
--resume" error); so do the study's printed ``-- KEY VALUE --status`` line and ``--dry-run`` /
``--methods`` after the overrides. Values are never taken for options, even those that start
with ``-``."""

from __future__ import annotations

import argparse

import pytest

from pretrain.cli.overrides import parse_args_and_overrides, split_trailing_options
from pretrain.engine.launch import argument_parser
from transfer.cli import linear_probe, semi_supervised, study, transfer_linear
from transfer.detection.trainer import build_argument_parser

MODEL = ["--random-init", "resnet18", "--output-dir", "/out"]


def _pretrain(argv: list[str]) -> argparse.Namespace:
    return parse_args_and_overrides(argument_parser("test"), argv)


def test_pretraining_options_after_the_overrides():
    args = _pretrain(["--config-file", "c.yaml", "SOLVER.MAX_ITER", "3", "--num-gpus", "2",
                      "LOSS.BETA", "-1.5", "--dist-url=tcp://h:1"])  # fmt: skip
    assert (args.config_file, args.num_gpus, args.dist_url) == ("c.yaml", 2, "tcp://h:1")
    assert args.opts == ["SOLVER.MAX_ITER", "3", "LOSS.BETA", "-1.5"]


def test_a_value_is_never_taken_for_an_option():
    """``OUTPUT_DIR --num-gpus`` is a (strange) value: it stays an override, as do values that
    start with ``-``; only a token where a KEY stands is an option."""
    args = _pretrain(["OUTPUT_DIR", "--num-gpus", "LOSS.X", "-1", "--num-machines", "2"])
    assert args.opts == ["OUTPUT_DIR", "--num-gpus", "LOSS.X", "-1"]
    assert (args.num_gpus, args.num_machines) == (1, 2)


def test_a_separator_before_the_overrides_is_not_an_override():
    assert _pretrain(["--", "SOLVER.MAX_ITER", "3"]).opts == ["SOLVER.MAX_ITER", "3"]


def test_linear_probe_resume_and_a_required_option_after_the_overrides():
    """``--data-root`` is required: given only after the overrides, it is still found."""
    args = linear_probe.parse_args(
        [*MODEL, "SOLVER.MAX_ITER", "3", "--data-root", "/d", "--resume", "--num-gpus", "2"]
    )
    assert (args.data_root, args.resume, args.num_gpus) == ("/d", True, 2)
    assert args.opts == ["SOLVER.MAX_ITER", "3"]


def test_semi_supervised_and_transfer_options_after_the_overrides():
    semi = semi_supervised.parse_args([*MODEL, "SOLVER.NUM_LRS", "2", "--data-root", "/d",
                                       "--split-file", "s.txt"])  # fmt: skip
    assert (semi.data_root, semi.split_file, semi.opts) == ("/d", "s.txt", ["SOLVER.NUM_LRS", "2"])
    transfer = transfer_linear.parse_args([*MODEL, "TRANSFER.NUM_LRS", "2", "--datasets", "dtd",
                                           "--overwrite"])  # fmt: skip
    assert (transfer.datasets, transfer.overwrite) == ("dtd", True)
    assert transfer.opts == ["TRANSFER.NUM_LRS", "2"]


def test_train_net_resume_and_registration_after_the_overrides():
    argv = ["--config-file", "c.yaml", "SOLVER.MAX_ITER", "3", "--register-coco", "n", "j.json",
            "img", "--resume"]  # fmt: skip
    args = parse_args_and_overrides(build_argument_parser(), argv)
    assert args.resume and args.register_coco == [["n", "j.json", "img"]]
    assert args.opts == ["SOLVER.MAX_ITER", "3"]


@pytest.mark.parametrize(
    "tail",
    [
        ["--dry-run", "--methods", "lorac", "mocom"],
        ["--methods", "lorac", "mocom", "--dry-run"],
        ["--methods", "lorac", "mocom", "SOLVER.BASE_LR", "0.1", "--dry-run"],
    ],
)
def test_study_flags_and_lists_after_the_overrides(tail):
    """A list option after the overrides takes its values up to the next option or KEY."""
    args = study.parse_args(["--seeds", "0", "--", "SOLVER.MAX_ITER", "2", *tail])
    assert args.dry_run and args.methods == ["lorac", "mocom"] and args.seeds == [0]
    extra = ["SOLVER.BASE_LR", "0.1"] if "SOLVER.BASE_LR" in tail else []
    assert args.opts == ["SOLVER.MAX_ITER", "2", *extra]


def test_study_status_as_the_slurm_executor_prints_it():
    args = study.parse_args(["--experiment", "in100-beta", "--", "DATASETS.ROOT", "/d", "--status"])
    assert args.status and args.opts == ["DATASETS.ROOT", "/d"]


def test_split_keeps_unknown_tokens_and_the_order_of_the_overrides():
    parser = argument_parser("test")
    options, kept = split_trailing_options(
        parser, ["--", "A.B", "1", "--num-gpus", "4", "C", "--not-an-option", "D", "x"]
    )
    assert options == ["--num-gpus", "4"]
    assert kept == ["--", "A.B", "1", "C", "--not-an-option", "D", "x"]
