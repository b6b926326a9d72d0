"""The one compile guard: inside a graph ``torch.compile`` traces, take the graph-safe path."""

from __future__ import annotations

import torch

__all__ = ["in_compiled_graph"]


def in_compiled_graph() -> bool:
    """Whether this call is traced into a compiled graph. There the code computes afresh what eager
    code keeps across calls (constants, index tables, low-precision weights; a kept value would be
    a guard: its state on the first call recompiles the graph on the second, where the compiler
    folds or fuses the values for free) and writes no ``out=`` tensor (dynamo refuses a
    channels_last one)."""
    return torch.compiler.is_compiling()
