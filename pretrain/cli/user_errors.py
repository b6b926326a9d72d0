"""The one way every tool ends on a user error: an ``error: <message>`` line and exit status 2;
on a Ctrl-C that stops it at once: an ``interrupted:`` line and status 130; and the ``main`` of
the tools that parse, then run (:func:`tool_main`), which ends both ways.

A :class:`~pretrain.utils.errors.LoracError` is an error the user can fix; anything else is a bug
and keeps its traceback. argparse uses the same status, so a caller can tell "fix the input" from
"crashed" by the exit status alone.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import signal
import sys
from collections.abc import Callable, Iterator
from typing import ParamSpec, TypeVar

from pretrain.cli.quiet import run_quietly
from pretrain.utils.errors import USER_ERROR_EXIT_CODE, LoracError

__all__ = ["INTERRUPTED_EXIT_CODE", "exit_on_interrupt", "exit_on_user_error", "tool_main"]

# what a shell reports for a command ended by Ctrl-C
INTERRUPTED_EXIT_CODE = 128 + signal.SIGINT

P = ParamSpec("P")
R = TypeVar("R")


def _is_main_process() -> bool:
    # Read from sys.modules instead of importing torch: without torch.distributed imported there
    # is no process group, and tools such as collect_detection_results start without torch.
    dist = sys.modules.get("torch.distributed")
    return (
        dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_rank() == 0
    )


def _is_worker_user_error_exit(e: BaseException) -> bool:
    """Whether ``e`` is detectron2's ``launch`` reporting a worker that exited through
    :func:`exit_on_user_error` (that worker has printed the error line already)."""
    mp = sys.modules.get("torch.multiprocessing")
    return (
        mp is not None
        and isinstance(e, mp.ProcessExitedException)
        and e.exit_code == USER_ERROR_EXIT_CODE
    )


def exit_on_user_error(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a tool's ``main`` (and ``launch``'s worker function): a :class:`LoracError`
    prints ``error: <message>`` on one line (main process) and raises ``SystemExit(2)``; a
    ``launch`` worker that ended this way ends its parent the same way, silently."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return run_quietly(fn, *args, **kwargs)  # library noise: --verbose
        except LoracError as e:
            if _is_main_process():
                print(f"error: {' '.join(str(e).split())}", file=sys.stderr, flush=True)
            raise SystemExit(USER_ERROR_EXIT_CODE) from None
        except Exception as e:
            if _is_worker_user_error_exit(e):
                raise SystemExit(USER_ERROR_EXIT_CODE) from None
            raise

    return wrapper


@contextlib.contextmanager
def exit_on_interrupt(hint: Callable[[], str]) -> Iterator[None]:
    """End a tool that Ctrl-C reaches as ``KeyboardInterrupt`` with one line, ``interrupted:
    stopped at once; <hint()>``, and exit status :data:`INTERRUPTED_EXIT_CODE`; ``hint`` says,
    from what is on disk then, how to go on."""
    try:
        yield
    except KeyboardInterrupt:
        if _is_main_process():
            print(f"interrupted: stopped at once; {hint()}", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT_CODE) from None


def tool_main(
    parse: Callable[[list[str] | None], argparse.Namespace],
    run: Callable[[argparse.Namespace], int | None],
    hint: Callable[[argparse.Namespace], str],
) -> Callable[[list[str] | None], int]:
    """The ``main(argv=None) -> int`` of a tool that is ``run(parse(argv))`` (exit status its
    return value, 0 for None): a user error ends it as :func:`exit_on_user_error` says, a Ctrl-C
    that stops it at once as :func:`exit_on_interrupt` says with ``hint(args)``."""

    def main(argv: list[str] | None = None) -> int:
        args = parse(argv)
        with exit_on_interrupt(lambda: hint(args)):
            return run(args) or 0

    main.__module__ = parse.__module__  # the tool's, as a main written there would have it
    return exit_on_user_error(main)
