"""torch.compile's recompiles, each told in one line with its cause.

dynamo says why it recompiles a function (the guard that failed and the source line that read
the value) only through its ``recompiles`` log artifact (``TORCH_LOGS=recompiles``), as a
multi-line message written before the new graph is compiled. :class:`RecompileWatch` turns that
artifact on while it is entered (torch's own printing of it stays as the user set it) and hands
each message, as one line, to a callback: the trainer logs it, so that a recompile (minutes of
inductor on a GPU) is announced when it starts, and the GPU check counts it. The artifact and
its message are the same in torch 2.11 and 2.14; where a torch lacks them, nothing is reported
and :attr:`RecompileWatch.supported` is False (the trainer then says a graph was added without
its cause).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from types import TracebackType

__all__ = ["RecompileWatch", "compiled_graphs", "recompile_cause"]

# torch._dynamo.guards' artifact logger (torch._logging.getArtifactLogger(__name__, "recompiles"))
_LOGGER = "torch._dynamo.guards.__recompiles"
_FAILURE = re.compile(r"^\s*-\s+(\d+/\d+: .*)$")  # "- 0/0: self.x == 1  # source line"


def compiled_graphs() -> int:
    """The graphs dynamo has made in this process (every compiled function's; its counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def recompile_cause(message: str) -> str:
    """dynamo's recompile message (``Recompiling function F in FILE:LINE`` and its guard
    failures) as one line: the function, its file's name and line, and the first failed guard
    with the source line that read its value."""
    lines = message.splitlines()
    head = lines[0].strip() if lines else message
    m = re.match(r"Recompiling function (\S+) in (.+):(\d+)$", head)
    where = f"{m.group(1)} ({m.group(2).rsplit('/', 1)[-1]}:{m.group(3)})" if m else head
    failures = [f.group(1) for f in map(_FAILURE.match, lines) if f]
    guard = " ".join(failures[0].split()) if failures else "guard failure not given"
    more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
    return f"{where}: {guard}{more}"


class RecompileWatch(logging.Handler):
    """While entered, calls ``announce(cause)`` for every recompile dynamo starts (the cause as
    :func:`recompile_cause` writes it) and keeps the causes in :attr:`causes`."""

    def __init__(self, announce: Callable[[str], None] | None = None) -> None:
        super().__init__(logging.DEBUG)
        self.announce = announce
        self.causes: list[str] = []
        self.supported = False
        self._saved: tuple | None = None

    def emit(self, record: logging.LogRecord) -> None:
        cause = recompile_cause(record.getMessage())
        self.causes.append(cause)
        if self.announce is not None:
            self.announce(cause)

    def __enter__(self) -> RecompileWatch:
        try:
            from torch._logging._internal import log_state  # private: no public switch exists
        except ImportError:
            return self
        if not hasattr(log_state, "artifact_names"):
            return self
        log = logging.getLogger(_LOGGER)
        enabled = log_state.is_artifact_enabled("recompiles")
        self._saved = (log, log.level, log.propagate, enabled)
        if not enabled:  # ours alone: torch's handlers print it only where the user asked
            log_state.enable_artifact("recompiles")
            log.propagate = False
        log.setLevel(logging.DEBUG)
        log.addHandler(self)
        self.supported = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._saved is None:
            return
        from torch._logging._internal import log_state

        log, level, propagate, enabled = self._saved
        log.removeHandler(self)
        log.setLevel(level)
        log.propagate = propagate
        if not enabled:
            log_state.artifact_names.discard("recompiles")
        self._saved = None
