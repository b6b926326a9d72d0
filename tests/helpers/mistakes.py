"""What every user mistake must end in: exit 2, exactly one ``error:`` line, no traceback, and
no file written or changed.

The table-driven mistake tests (``tests/**/test_*mistakes*.py``) run each tool with a plausible
mistake through :func:`run_tool` (a real process, as a shell runs it) or :func:`run_main` (the
tool's ``main`` in this process, where a process adds nothing: the exit status is the
``SystemExit`` code, the output what ``main`` printed) and check the result with
:func:`assert_user_error`, giving it a :func:`snapshot` of the directories the tool could have
written, taken before the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ToolResult", "assert_user_error", "run_main", "run_tool", "snapshot"]

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


def run_main(main: Callable[[list[str]], int], argv: list[str]) -> ToolResult:
    """``main(argv)`` of a tool in this process, ended as the interpreter would end it: the exit
    status of its ``SystemExit`` (or its return value), and for any other exception (a
    ``KeyboardInterrupt`` included) status 1 with the traceback in ``stderr``."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - what the interpreter prints for an uncaught one
            traceback.print_exc()
            code = 1
    return ToolResult([getattr(main, "__module__", "main"), *argv], code, out.getvalue(),
                      err.getvalue())  # fmt: skip


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
