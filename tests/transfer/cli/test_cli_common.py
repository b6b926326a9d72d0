"""transfer.cli.common: the argument handling the evaluation tools share."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from transfer.cli.common import launch_parser, options_from_args, parse_launch_args


@dataclass
class _Options:
    dataset: str
    views: int = 32
    device: str = "cpu"


def test_options_take_the_arguments_of_their_fields_then_the_overrides():
    args = argparse.Namespace(dataset="imagefolder", device="", out="o")  # no --views, extra --out
    opt = options_from_args(_Options, args, device="cuda")
    assert opt == _Options(dataset="imagefolder", views=32, device="cuda")


def test_launch_tools_refuse_eval_only(capsys):
    parser = launch_parser("doc")
    args = parse_launch_args(parser, ["--random-init", "resnet18", "--output-dir", "o"])
    assert args.random_init == "resnet18" and args.num_gpus == 1
    with pytest.raises(SystemExit) as e:
        parse_launch_args(parser, ["--random-init", "resnet18", "--output-dir", "o", "--eval-only"])
    assert e.value.code == 2
    assert "--eval-only is not supported" in capsys.readouterr().err
