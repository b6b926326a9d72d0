"""The one compile guard: inside a graph ``torch.compile`` traces, take the graph-safe path."""

from __future__ import annotations

import torch

__all__ = ["in_compiled_graph"]


def in_compiled_graph() -> bool:
    """Whether this call is being traced into a compiled graph. There the code computes afresh
    what eager code keeps across calls (normalisation constants, the Jacobi index tables, the key
    encoder's low-precision weights): a Python-side cache or kept buffer would be a guard of the
    graph, its state on the first call recompiling it on the second, while in the graph the values
    cost nothing (folded or fused by the compiler). Likewise no ``out=`` into a tensor made outside
    the op: dynamo refuses a non-contiguous (channels_last) one."""
    return torch.compiler.is_compiling()
