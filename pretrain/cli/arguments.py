"""The argument parser of every tool, the range-checked number types of their options, their
``--device``, and the options dataclasses filled from the parsed arguments.

:class:`ToolParser` ends a bad command line as every user error ends (:mod:`.user_errors`): one
``error:`` line, exit status 2, an unknown option named with the closest known one (argparse's
usage block and "unrecognized arguments" name neither). Abbreviated options are refused, so that
a typo is one wherever it stands. The number types refuse an out-of-range value while parsing.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from pretrain.utils.errors import USER_ERROR_EXIT_CODE

__all__ = [
    "CONFIG_KEY",
    "ToolParser",
    "add_device_arg",
    "comma_separated",
    "did_you_mean",
    "int_at_least",
    "looks_like_option",
    "options_from_args",
    "unknown_option",
    "positive_float",
    "unknown_option_message",
]

# yacs/detectron2 keys (SOLVER.BASE_LR, OUTPUT_DIR): the token after one is its value
CONFIG_KEY = re.compile(r"[A-Z][A-Z0-9_]*(\.[A-Z0-9_]+)*")
# argparse messages a mistyped option causes (the option meant was then missing, or left over)
_TYPO_SYMPTOMS = ("unrecognized arguments", "the following arguments are required")

_Options = TypeVar("_Options")


def looks_like_option(token: str) -> bool:
    """Whether ``token`` is written as an option (``--x``, ``-x``), not a number or ``--``."""
    if not token.startswith("-") or token in ("-", "--"):
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def _known(parser: argparse.ArgumentParser, token: str) -> bool:
    options = parser._option_string_actions  # argparse's own table of option strings
    return token in options or token.partition("=")[0] in options


def unknown_option(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first token of ``argv`` written as an option that ``parser`` does not have (values
    of ``KEY VALUE`` overrides are skipped; nothing after ``--`` is an option)."""
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            return None
        if CONFIG_KEY.fullmatch(token):
            next(tokens, None)
        elif looks_like_option(token) and not _known(parser, token):
            return token
    return None


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """``"; did you mean X?"`` for the choice closest to ``word`` (difflib), ``""`` if none is
    close."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def unknown_option_message(parser: argparse.ArgumentParser, token: str) -> str:
    """``unrecognized option --x`` and the closest option of ``parser`` where one is close."""
    name = token.partition("=")[0]
    options = [o for o in parser._option_string_actions if o.startswith("--")]
    return f"unrecognized option {name}{did_you_mean(name, options)}"


class ToolParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one ``error:`` line and exit status 2; see
    the module docstring. ``--help`` is argparse's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self._argv: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        unknown = unknown_option(self, self._argv)
        if unknown is not None and message.startswith(_TYPO_SYMPTOMS):
            message = unknown_option_message(self, unknown)
        print(f"error: {' '.join(message.split())}", file=sys.stderr)
        raise SystemExit(USER_ERROR_EXIT_CODE)


def int_at_least(low: int) -> Callable[[str], int]:
    """argparse ``type`` of an integer option that must be ``>= low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value

    parse.__name__ = f"int_at_least_{low}"
    return parse


def comma_separated(choices: Sequence[str]) -> Callable[[str], str]:
    """argparse ``type`` of an option naming some of ``choices``, comma-separated
    (``cifar10,dtd``); the text is returned as given, ``""`` (none given) included."""

    def parse(text: str) -> str:
        for word in (w.strip() for w in text.split(",") if text):
            if word not in choices:
                raise argparse.ArgumentTypeError(
                    f"unknown name {word!r}{did_you_mean(word, choices)} (choose from "
                    f"{', '.join(choices)})"
                )
        return text

    parse.__name__ = "comma_separated"
    return parse


def positive_float(text: str) -> float:
    """argparse ``type`` of a number option that must be finite and ``> 0``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    """``--device``: a torch device name, or empty for the default (this process's GPU if any)."""
    parser.add_argument("--device", default="", help="cpu, cuda, cuda:1 (default: auto)")


def options_from_args(
    cls: Callable[..., _Options], args: argparse.Namespace, **overrides: Any
) -> _Options:
    """The options dataclass ``cls`` with every field that ``args`` has an argument of the same
    name for taken from ``args``, then ``overrides``; the other fields keep their defaults."""
    values = {
        f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)
    }
    return cls(**{**values, **overrides})
