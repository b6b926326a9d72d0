"""What every user mistake must end in: exit 2, exactly one ``error:`` line, no traceback, and
no file written or changed.

The table-driven mistake tests (``tests/**/test_*mistakes*.py``) run each tool with a plausible
mistake through :func:`run_tool` (a real process, as a shell runs it) or :func:`run_main` (the
tool's ``main`` in this process, where a process adds nothing: the exit status is the
``SystemExit`` code, the output what ``main`` printed, warned and logged) and check the result
with :func:`assert_user_error`, giving it a :func:`snapshot` of the directories the tool could
have written, taken before the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import logging
import os
import re
import signal
import subprocess
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ToolResult", "assert_user_error", "run_main", "run_tool", "snapshot", "tool_main"]

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class ToolResult:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_tool(
    argv: list[str], cwd: Path | str | None = None, timeout: float = 300, **env: str
) -> ToolResult:
    """``python <argv...>`` from the repository root (or ``cwd``) in a fresh process with one
    thread; ``argv[0]`` is a script such as ``tools/linear_probe.py``."""
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **env}
    script = argv[0] if os.path.isabs(argv[0]) else str(REPO / argv[0])
    proc = subprocess.run(
        [sys.executable, script, *argv[1:]],
        cwd=str(cwd or REPO),
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return ToolResult(argv, proc.returncode, proc.stdout, proc.stderr)


def tool_main(script: str) -> Callable[[list[str]], int]:
    """The ``main`` that ``script`` (``tools/<tool>.py``, a thin wrapper) calls: the one its
    ``from <module> import main`` line names."""
    text = (REPO / script).read_text()
    found = re.search(r"^from (\S+) import main$", text, re.M)
    assert found, f"{script}: no 'from <module> import main' line"
    return importlib.import_module(found.group(1)).main


def run_main(main: Callable[[list[str]], int], argv: list[str]) -> ToolResult:
    """``main(argv)`` of a tool in this process, ended as the interpreter would end it: the exit
    status of its ``SystemExit`` (or its return value), and for any other exception (a
    ``KeyboardInterrupt`` included) status 1 with the traceback in ``stderr``.

    The output is all that a process would print: ``print``, warnings and every log record
    (:func:`_fresh_process`); what the tool changes in this process (the working directory,
    environment variables, signal handlers, ``sys.argv``, torch's thread count, warnings filters,
    log handlers) is undone afterwards, so one row does not leak into the next."""
    out, err = io.StringIO(), io.StringIO()
    tool = getattr(main, "__module__", "main")
    with _fresh_process([f"tools/{tool.rsplit('.', 1)[-1]}.py", *argv], out, err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught one
            traceback.print_exc()
            code = 1
    return ToolResult([tool, *argv], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _fresh_process(argv: list[str], out: io.StringIO, err: io.StringIO) -> Iterator[None]:
    """This process as ``python <argv...>`` would start it (``sys.argv``, whose first item
    argparse names in its messages; one torch thread, as :func:`run_tool`'s
    ``OMP_NUM_THREADS=1``), its stdout and stderr into ``out`` and ``err``; everything
    restored on the way out."""
    cwd, environ, saved_argv = os.getcwd(), dict(os.environ), sys.argv
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else 0
    sys.argv = argv
    if torch is not None:
        torch.set_num_threads(1)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(contextlib.redirect_stdout(out))
            stack.enter_context(contextlib.redirect_stderr(err))
            stack.enter_context(_process_warnings())
            stack.enter_context(_process_logging())
            stack.enter_context(_process_datasets())
            yield
    finally:
        sys.argv = saved_argv
        os.chdir(cwd)
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
        for s, handler in signals.items():
            if handler is not None:  # None: a handler not set from Python, nothing to restore
                signal.signal(s, handler)
        if threads:
            torch.set_num_threads(threads)


@contextlib.contextmanager
def _process_warnings() -> Iterator[None]:
    """Warnings printed on stderr, as a process prints them (pytest records them instead),
    without the categories Python hides by default; filters restored afterwards."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                         ResourceWarning):  # fmt: skip
            warnings.filterwarnings("ignore", category=category)
        warnings.showwarning = show
        yield


@contextlib.contextmanager
def _process_datasets() -> Iterator[None]:
    """The datasets a run registers with detectron2 (``--register-coco``) unregistered after it,
    as they end with a process (registering a name again over other files is an error). Only
    where ``detectron2.data`` is imported already: importing it registers the builtin sets."""
    data = sys.modules.get("detectron2.data")
    before = set(data.DatasetCatalog.list()) if data is not None else set()
    try:
        yield
    finally:
        added = set(data.DatasetCatalog.list()) - before if data is not None else set()
        for name in added:
            data.DatasetCatalog.remove(name)
            data.MetadataCatalog.remove(name)


def _all_loggers() -> list[logging.Logger]:
    loggers = logging.Logger.manager.loggerDict.values()
    return [logging.getLogger(), *(lg for lg in loggers if isinstance(lg, logging.Logger))]


@contextlib.contextmanager
def _process_logging() -> Iterator[None]:
    """Log records where a fresh process sends them: no handler of an earlier run (a console
    handler bound to another test's stream, a log.txt of another run) and none of pytest's
    on the root logger, so a record no handler of this run takes reaches stderr through
    ``logging.lastResort``; detectron2's ``setup_logger``, cached so that a second call in a
    process adds no handler, adds this run's. Afterwards the handlers are those of before."""
    saved = {lg: lg.handlers[:] for lg in _all_loggers()}
    for lg in saved:
        lg.handlers = []
    _clear_setup_logger_cache()
    try:
        yield
    finally:
        for lg in _all_loggers():
            for handler in lg.handlers:
                handler.flush()
            lg.handlers = saved.get(lg, [])
        _clear_setup_logger_cache()  # its loggers' handlers are gone: the next call adds them


def _clear_setup_logger_cache() -> None:
    setup_logger = getattr(sys.modules.get("detectron2.utils.logger"), "setup_logger", None)
    if hasattr(setup_logger, "cache_clear"):
        setup_logger.cache_clear()


def snapshot(*roots: Path | str) -> dict[str, str]:
    """Every file and directory under ``roots``: path -> sha256 of its bytes ("dir" for a
    directory). Missing roots are recorded as missing, so creating one is a change too."""
    out: dict[str, str] = {}
    for root in map(Path, roots):
        if not root.exists():
            out[str(root)] = "missing"
            continue
        for path in sorted([root, *root.rglob("*")]):
            out[str(path)] = (
                "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
            )
    return out


def assert_user_error(
    result: ToolResult, before: dict[str, str], *roots: Path | str, match: str = ""
) -> None:
    """``result`` is a user error: exit 2, exactly one ``error:`` line (containing ``match``),
    no traceback; and ``roots`` are exactly as in ``before`` (their :func:`snapshot`)."""
    where = f"{' '.join(result.argv)}\n--- output ---\n{result.output}"
    assert result.returncode == 2, f"exit {result.returncode}, not 2: {where}"
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"{len(errors)} 'error:' lines, not 1: {where}"
    assert "Traceback" not in result.output, f"a traceback: {where}"
    assert match in errors[0], f"{match!r} not in {errors[0]!r}"
    after = snapshot(*roots)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"files written or changed: {changed}: {where}"
