"""Options anywhere on a command line that ends in ``KEY VALUE`` config overrides.

The tools take their overrides as a trailing ``argparse.REMAINDER`` (detectron2's ``opts``), which
would make ``--resume`` in ``... SOLVER.MAX_ITER 3 --resume`` an override.
:func:`parse_args_and_overrides` takes the tool's own options out of the overrides and parses
again with them in front. Only a token in a KEY position that is exactly one of the parser's
options is taken, with its values (a value such as ``LOSS.X -1.5`` is never taken); any other
option-like token in a KEY position is refused as a mistyped option.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence

from pretrain.cli.arguments import CONFIG_KEY, looks_like_option, unknown_option_message

__all__ = ["parse_args_and_overrides", "split_trailing_options"]


def _option(parser: argparse.ArgumentParser, token: str) -> tuple[argparse.Action | None, bool]:
    """The parser's action for ``token`` (exactly an option string, or ``--option=value``) and
    whether the value came inline; ``(None, False)`` when ``token`` is no option of ``parser``."""
    actions = parser._option_string_actions  # argparse's own table of option strings
    if token in actions:
        return actions[token], False
    name, sep, _ = token.partition("=")
    if sep and name.startswith("--") and name in actions:
        return actions[name], True
    return None, False


def _is_boundary(parser: argparse.ArgumentParser, token: str) -> bool:
    return (
        token == "--" or _option(parser, token)[0] is not None or bool(CONFIG_KEY.fullmatch(token))
    )


def _values_taken(parser: argparse.ArgumentParser, action: argparse.Action, rest: list[str]) -> int:
    """How many of the tokens ``rest`` after an option are its values."""
    nargs = action.nargs
    if nargs == 0:  # store_true/_false/_const, append_const, count, help, version
        return 0
    if nargs is None:
        return min(1, len(rest))
    if isinstance(nargs, int):
        return min(nargs, len(rest))
    limit = 1 if nargs == argparse.OPTIONAL else len(rest)
    count = 0
    while count < limit and not _is_boundary(parser, rest[count]):
        count += 1
    return count


def split_trailing_options(
    parser: argparse.ArgumentParser, overrides: Sequence[str]
) -> tuple[list[str], list[str]]:
    """``(options, overrides)``: ``parser``'s own options found in KEY positions of ``overrides``
    (with their values), and the overrides without them (a leading ``--`` included)."""
    tokens = list(overrides)
    options: list[str] = []
    kept: list[str] = ["--"] if tokens[:1] == ["--"] else []
    i = len(kept)
    while i < len(tokens):
        action, inline = _option(parser, tokens[i])
        if action is None:
            kept += tokens[i : i + 2]  # KEY VALUE
            i += 2
            continue
        n = 0 if inline else _values_taken(parser, action, tokens[i + 1 :])
        options += tokens[i : i + 1 + n]
        i += 1 + n
    return options, kept


@contextlib.contextmanager
def _nothing_required(parser: argparse.ArgumentParser) -> Iterator[None]:
    """While it lasts, no option or group of ``parser`` is required: a required option given
    after the overrides (``... SOLVER.MAX_ITER 3 --data-root D``) is found by the second parse."""
    saved = [(a, a.required) for a in parser._actions]
    saved += [(g, g.required) for g in parser._mutually_exclusive_groups]
    try:
        for obj, _ in saved:
            obj.required = False
        yield
    finally:
        for obj, required in saved:
            obj.required = required


def _without_separator(args: argparse.Namespace, dest: str) -> argparse.Namespace:
    overrides = getattr(args, dest, None)
    if overrides and overrides[0] == "--":  # argparse keeps it in a REMAINDER
        setattr(args, dest, overrides[1:])
    return args


def parse_args_and_overrides(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, dest: str = "opts"
) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with ``parser``'s options accepted after its trailing
    ``KEY VALUE`` overrides ``dest`` too, and ``--`` before them."""
    argv = list(sys.argv[1:] if argv is None else argv)
    with _nothing_required(parser):
        first = parser.parse_args(argv)
    overrides = list(getattr(first, dest, None) or [])
    start = len(argv) - len(overrides)
    if not overrides or argv[start:] != overrides:
        return _without_separator(parser.parse_args(argv), dest)
    options, kept = split_trailing_options(parser, overrides)
    for key in kept[1 if kept[:1] == ["--"] else 0 :: 2]:
        if looks_like_option(key):  # no config key starts with "-": a mistyped option
            parser.error(unknown_option_message(parser, key))
    if kept and kept[0] != "--":
        kept = ["--", *kept]  # the options moved in front may take a list of values
    return _without_separator(parser.parse_args([*argv[:start], *options, *kept]), dest)
