"""pretrain.cli.launching: the parser and checks of every tool that runs under ``launch``."""

from __future__ import annotations

import pytest

from pretrain.cli.launching import launch_parser, parse_launch_args


def _refused(argv: list[str], capsys, eval_only: bool = False) -> str:
    with pytest.raises(SystemExit) as e:
        parse_launch_args(launch_parser("doc"), argv, eval_only=eval_only)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_eval_only_is_refused_unless_the_tool_takes_it(capsys):
    args = parse_launch_args(launch_parser("doc"), ["--num-gpus", "2", "SOLVER.MAX_ITER", "3"])
    assert args.num_gpus == 2 and args.opts == ["SOLVER.MAX_ITER", "3"] and not args.eval_only
    assert _refused(["--eval-only"], capsys) == "error: --eval-only is not supported by this tool\n"
    assert parse_launch_args(launch_parser(), ["--eval-only"], eval_only=True).eval_only


def test_process_counts_below_one_and_a_rank_outside_the_machines_are_refused(capsys):
    assert _refused(["--num-gpus", "0"], capsys).startswith("error: argument --num-gpus: must be")
    err = _refused(["--num-machines", "2", "--machine-rank", "2"], capsys)
    assert err == "error: argument --machine-rank: must be in [0, --num-machines 2), got 2\n"
