"""What a CUDA graph replay needs to be the same from step to step: the sequence of ops seen at
the dispatcher (aten and c10d), each with the metadata of its arguments and results."""

from __future__ import annotations

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from pretrain.diagnostics.op_counter import describe  # the step counter's description of an op


class OpRecorder(TorchDispatchMode):
    """Records every op dispatched while active: ``ops`` holds ``(name, describe(args),
    describe(kwargs), describe(result))`` per op, ``calls`` ``(name, args, kwargs)`` (the
    arguments themselves, to check where an index came from)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, ...]] = []
        self.calls: list[tuple[str, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        self.calls.append((name, args, kwargs))
        self.ops.append((name, describe(args), describe(kwargs), describe(out)))
        return out

    def names(self) -> list[str]:
        return [op[0] for op in self.ops]
