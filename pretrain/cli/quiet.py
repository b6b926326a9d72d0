"""What a tool prints: its own lines, not its libraries' warnings, unless ``--verbose``.

A user can act on none of the libraries' warnings (or torch's "No CUDA runtime is found" line),
so :func:`run_quietly` runs a tool's ``main`` with library warnings ignored and torch's log lines
below ERROR dropped; the project's own warnings stay visible (bugs to fix at the call).
``--verbose`` anywhere on the command line shows everything; it is taken out before the tool's
parser reads it, except in the tools whose own option it is (:data:`OWN_VERBOSE`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["OWN_VERBOSE", "VERBOSE_FLAG", "library_output_hidden", "run_quietly"]

VERBOSE_FLAG = "--verbose"
# The modules of the tools whose parsers define --verbose themselves: their argv keeps it.
OWN_VERBOSE = ("transfer.cli.convert_to_d2",)

# Warnings attributed to any module but the project's own (and the tools run as scripts).
_LIBRARY_MODULE = r"(?!(?:pretrain|transfer|lorac_configs|tests|__main__)(?:\.|$))"
# The loggers of libraries that print to the console without the tools configuring them.
_LIBRARY_LOGGERS = ("torch",)

R = TypeVar("R")


@contextlib.contextmanager
def library_output_hidden(hidden: bool = True) -> Iterator[None]:
    """Within: library warnings ignored and the library loggers' records below ERROR dropped
    (nothing changes when ``hidden`` is False); the filters and levels of before afterwards."""
    if not hidden:
        yield
        return
    loggers = [logging.getLogger(name) for name in _LIBRARY_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=_LIBRARY_MODULE)
        for lg in loggers:
            lg.setLevel(max(lg.getEffectiveLevel(), logging.ERROR))
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


def run_quietly(fn: Callable[..., R], *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)`` with library output hidden unless ``--verbose`` is given: ``fn``
    is a tool's ``main(argv=None)``, whose ``argv`` loses the flag, or ``launch``'s worker
    function, which looks for it in ``sys.argv``."""
    argv = args[0] if args else kwargs.get("argv")
    if isinstance(argv, list | tuple) or (not args and not kwargs):
        given = list(sys.argv[1:] if argv is None else argv)
        verbose = VERBOSE_FLAG in given
        if verbose and getattr(fn, "__module__", "") not in OWN_VERBOSE:
            args, kwargs = ([t for t in given if t != VERBOSE_FLAG],), {}
    else:
        verbose = VERBOSE_FLAG in sys.argv[1:]
    with library_output_hidden(not verbose):
        return fn(*args, **kwargs)
