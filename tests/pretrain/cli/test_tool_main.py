"""pretrain.cli.user_errors.tool_main: the main of a tool that parses, then runs, ends as every
tool ends: its run's status, one ``error:`` line and status 2 for a user error, one
``interrupted:`` line with the tool's hint and status 130 for a Ctrl-C that stops it at once."""

from __future__ import annotations

import argparse

import pytest

from pretrain.cli.arguments import ToolParser
from pretrain.cli.user_errors import tool_main
from pretrain.utils.errors import LoracError
from tests.helpers.mistakes import run_main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ToolParser()
    parser.add_argument("--then", choices=("finish", "fail", "stop"), required=True)
    parser.add_argument("--out", default="o")
    return parser.parse_args(argv)


def _run(args: argparse.Namespace) -> int | None:
    if args.then == "fail":
        raise LoracError(f"--out {args.out}: not a folder")
    if args.then == "stop":
        raise KeyboardInterrupt
    print("finished")
    return None


main = tool_main(parse_args, _run, lambda args: f"{args.out} holds nothing yet")


@pytest.mark.parametrize(
    "then,status,line",
    [
        ("finish", 0, "finished"),
        ("fail", 2, "error: --out x: not a folder"),
        ("stop", 130, "interrupted: stopped at once; x holds nothing yet"),
    ],
)
def test_a_tool_main_ends_as_every_tool_ends(then, status, line):
    r = run_main(main, ["--then", then, "--out", "x"])
    assert (r.returncode, r.output.strip()) == (status, line), r.output


def test_a_bad_command_line_is_the_parsers_error_line():
    r = run_main(main, ["--then", "finish", "--outt", "x"])
    assert r.returncode == 2
    assert r.output.strip() == "error: unrecognized option --outt; did you mean --out?"


def test_the_main_is_the_tools_own():
    """Its module is the tool's (``run_main`` and ``--verbose`` handling read it)."""
    assert main.__module__ == __name__
