"""What a CUDA graph replay needs to be the same from step to step: the sequence of ops seen at
the dispatcher (aten and c10d), each with the metadata of its arguments and results."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def describe(x: Any) -> Any:
    """A hashable description of an op argument or result: a tensor by shape, strides, dtype and
    device (not its values); numbers, lists of them (a collective's split sizes) and other plain
    values by value; anything else (a process group, a collective's work handle) by type."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.stride(), str(x.dtype), x.device.type)
    if isinstance(x, (list, tuple)):
        return tuple(describe(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, describe(v)) for k, v in x.items()))
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(x)  # a string pickles with any protocol (a memory_format does not)
    return type(x).__name__


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
