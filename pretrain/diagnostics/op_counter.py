"""What code run on the CPU would ask of a GPU: device ops, host syncs, copies, collectives.

:class:`StepCounter` is a ``TorchDispatchMode`` that counts every aten op whose inputs would live
on the GPU (tensors :meth:`~StepCounter.mark`-ed, and everything computed from them), and the
host syncs among them, each with the source line it comes from:

* ops that read a device value on the host (``.item()``, ``bool(t)``, ``.tolist()``,
  ``nonzero``, ...);
* syncs a GPU makes *inside* ops, which Python never sees (:data:`HIDDEN_SYNCS`: linalg error
  checks, output sizes read from values), boolean-mask indexing, indexing with host index
  tensors, and blocking host-to-device copies (``.to(device)``, ``torch.tensor(...,
  device=...)``, ``dst.copy_(host)`` and so ``t[i] = 5``, one element too, as CUDA's own sync
  detector showed on an H200);
* collectives (c10d ops): the bytes this rank sends and receives, and every collective whose
  input and output differ in memory layout (NCCL moves raw bytes: a channels_last input gathered
  into NCHW buffers scrambles the data).

:func:`pretrain.diagnostics.step_count.measure` counts one training step with it.
"""

from __future__ import annotations

import collections
import os
import sys
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["HIDDEN_SYNCS", "SYNC_OPS", "StepCounter", "describe", "innermost_frame", "short_path"]

ROOT = Path(__file__).resolve().parents[2]
# Ops that make the host wait for the device: a value or a data-dependent shape read back.
SYNC_OPS = {
    "aten._local_scalar_dense.default",
    "aten.is_nonzero.default",
    "aten.nonzero.default",
    "aten.equal.default",
    "aten.masked_select.default",
    "aten.unique_consecutive.default",
    "aten._unique2.default",
}
# Ops whose CUDA kernels make the host wait although no Python code reads a value: the host reads
# LAPACK-style ``info`` flags (``_linalg_check_errors``) or an output size that depends on values.
# docs/performance.md lists them with the reason; ``_check_errors`` ops only with the check on.
HIDDEN_SYNCS = {
    "aten._linalg_eigh.default": "linalg error check (eigh/eigvalsh)",
    "aten._linalg_svd.default": "linalg error check (svd/svdvals/matrix_norm nuc)",
    "aten.linalg_eig.default": "eig runs on the host for CUDA tensors",
    "aten.linalg_lstsq.default": "linalg error check (lstsq)",
    "aten.linalg_cholesky_ex.default": "linalg error check (cholesky, check_errors=True)",
    "aten.linalg_inv_ex.default": "linalg error check (inv, check_errors=True)",
    "aten._linalg_solve_ex.default": "linalg error check (solve, check_errors=True)",
    "aten.linalg_lu_factor_ex.default": "linalg error check (lu_factor, check_errors=True)",
    "aten.repeat_interleave.Tensor": "output size read from the repeats (no output_size)",
    "aten.bincount.default": "output size read from the values",
    "aten._unique.default": "output size read from the values",
    "aten.unique_dim.default": "output size read from the values",
}
_CHECK_ERRORS_OPS = {
    "aten.linalg_cholesky_ex.default",
    "aten.linalg_inv_ex.default",
    "aten._linalg_solve_ex.default",
    "aten.linalg_lu_factor_ex.default",
}
_INDEX_OPS = {
    "aten.index.Tensor",
    "aten.index_put.default",
    "aten.index_put_.default",
    "aten._index_put_impl_.default",
}
# Tensor methods that hand a device tensor's values to the host without an aten op the dispatch
# level sees (``.item()``, ``bool(t)`` ... are ``_local_scalar_dense``/``is_nonzero`` there).
_HOST_READS = {"tolist", "numpy", "cpu"}
_FACTORIES_WITH_DATA = {"tensor", "as_tensor", "asarray"}
# c10d ops whose first argument is what they write, the second what they read
_OUT_IN_OPS = {
    "allgather_",
    "_allgather_base_",
    "alltoall_",
    "alltoall_base_",
    "reduce_scatter_",
    "_reduce_scatter_base_",
}
# frames of the counting itself, never where an op was asked for
_COUNTING_FILES = ("/diagnostics/op_counter.py", "/diagnostics/step_count.py")


class StepCounter(TorchDispatchMode):
    """Counts device ops, host syncs (by source line) and collective bytes while not paused.

    A tensor is on the device when :meth:`mark` said so or an op computed it from one that is.
    Entering it also enters its :class:`_DeviceCopies` companion (the function-level view:
    ``.to(device)`` of a host tensor is no op at all when the device is the CPU).
    """

    def __init__(self) -> None:
        super().__init__()
        self.paused = False
        self.on_device: set[int] = set()
        self.ops = 0
        self.by_op: collections.Counter[str] = collections.Counter()
        self.by_source: collections.Counter[str] = collections.Counter()
        self.syncs: collections.Counter[str] = collections.Counter()
        self.collectives: collections.Counter[str] = collections.Counter()
        self.collective_bytes = 0
        self.collective_bytes_received = 0
        self.received_by_source: collections.Counter[str] = collections.Counter()
        self.layout_mismatches: list[str] = []
        self.async_copies: collections.Counter[str] = collections.Counter()
        self.copies = _DeviceCopies(self)
        # a list here records every device op and collective as (name, described arguments):
        # the sequence a graph replay needs to be the same step after step
        self.sequence: list[tuple] | None = None
        # the step's inputs (ids): a write into them (the learning rate) is what a replay is
        # fed, recorded as an input write without its value
        self.inputs: set[int] = set()

    def mark(self, tensors: Any) -> None:
        """Count ``tensors`` (any nesting) as device tensors."""
        for t in tree_flatten(tensors)[0]:
            if isinstance(t, torch.Tensor) and id(t) not in self.on_device:
                self.on_device.add(id(t))
                weakref.finalize(t, self.on_device.discard, id(t))

    def is_on_device(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and id(t) in self.on_device

    def sync(self, what: str) -> None:
        self.syncs[f"{what} at {_caller()}"] += 1

    def __enter__(self):  # noqa: ANN204
        self.copies.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.copies.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused:
            return out
        name = str(func)
        if name.startswith("c10d."):  # a round trip between processes, host tensors or not
            self._collective(name, args)
            self._record(name, args, kwargs)
        inputs = tree_flatten((args, kwargs))[0]
        if not any(self.is_on_device(t) for t in inputs):
            return out
        self.mark(out)
        self._record(name, args, kwargs)
        self.ops += 1
        self.by_op[name] += 1
        self.by_source[_caller(project_only=True).split(":")[0]] += 1
        if name in SYNC_OPS:
            self.sync(name.split(".")[1])
        elif name in HIDDEN_SYNCS:
            if name not in _CHECK_ERRORS_OPS or _check_errors(func, args, kwargs):
                self.sync(f"{name.split('.')[1]} ({HIDDEN_SYNCS[name]})")
        elif name == "aten.copy_.default" and self._blocking_host_source(args, kwargs):
            self.sync("copy_ of a host tensor into a device tensor (blocking copy)")
        elif name in _INDEX_OPS:
            indices = [t for t in tree_flatten(args[1])[0] if isinstance(t, torch.Tensor)]
            if any(t.dtype in (torch.bool, torch.uint8) for t in indices):
                self.sync(f"{name.split('.')[1]} with a boolean mask (nonzero inside)")
            elif any(not self.is_on_device(t) for t in indices) and not _in_backward(name):
                self.sync(f"{name.split('.')[1]} with a host index tensor (blocking copy)")
        return out

    def _record(self, name: str, args: tuple, kwargs: dict) -> None:
        if self.sequence is None:
            return
        if name in ("aten.fill_.Scalar", "aten.copy_.default") and id(args[0]) in self.inputs:
            self.sequence.append((name, "input write", describe(args[0])))
        else:
            self.sequence.append((name, describe(args), describe(kwargs)))

    def _blocking_host_source(self, args: tuple, kwargs: dict) -> bool:
        """``dst.copy_(src)`` of a host ``src`` into a device ``dst`` without non_blocking: on
        CUDA a copy followed by a stream sync, even for one element (``t[i] = 5`` is one)."""
        dst, src = args[0], args[1]
        non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
        return (
            self.is_on_device(dst)
            and isinstance(src, torch.Tensor)
            and not self.is_on_device(src)
            and not non_blocking
        )

    def _collective(self, name: str, args: tuple) -> None:
        where = _caller(project_only=True)
        self.collectives[f"{name} from {where}"] += 1
        sent, received = _collective_io(name, args)
        self.mark([*sent, *received])  # NCCL's buffers (DDP's buckets too) live on the GPU
        self.collective_bytes += sum(t.nbytes for t in sent)
        self.collective_bytes_received += sum(t.nbytes for t in received)
        self.received_by_source[f"{name} from {where}"] += sum(t.nbytes for t in received)
        layouts = {_layout(t) for t in [*sent, *received]}
        if len(layouts) > 1 or "strided" in layouts:
            self.layout_mismatches.append(f"{name} from {where}: {sorted(layouts)}")


class _DeviceCopies(TorchFunctionMode):
    """The host-to-device copies a GPU would make, seen where Python asks for them.

    ``t.to(device)`` (``.to(other)``, ``.cuda()``) of a host tensor and ``torch.tensor(data,
    device=...)`` make a device tensor with a copy, a host sync unless ``non_blocking`` (counted
    apart: on CUDA the project's copies go through pinned memory). Methods that hand a device
    tensor's values to Python (``tolist``, ``cpu``...) are syncs.
    """

    def __init__(self, counter: StepCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        c = self.counter
        if c.paused:
            return out
        name = getattr(func, "__name__", "")
        if name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor):
            src = args[0]
            if c.is_on_device(src) or not _names_a_device(name, args[1:], kwargs, c):
                return out
            c.mark(out)
            self._copy(src, _non_blocking(args[1:], kwargs), f".{name}()")
        elif kwargs.get("device") is not None and isinstance(out, torch.Tensor):
            c.mark(out)  # a factory told the device: torch.empty/zeros/full/tensor(..., device=)
            data = args[0] if args else kwargs.get("data")
            if name in _FACTORIES_WITH_DATA and not c.is_on_device(data):
                self._copy(out, False, f"torch.{name}(..., device=...)")
        elif name in _HOST_READS and args and c.is_on_device(args[0]):
            c.sync(f"{name}() of a device tensor")
        return out

    def _copy(self, t: torch.Tensor, non_blocking: bool, what: str) -> None:
        if non_blocking:
            self.counter.async_copies[f"{what} at {_caller()}"] += 1
        else:
            self.counter.sync(f"blocking host-to-device copy {what}")


def describe(x: Any) -> Any:
    """A hashable description of an op argument: a tensor by shape, strides, dtype and whether
    it is a device tensor (not its values); plain values and lists of them by value (a graph
    bakes them in); anything else (a process group, a work handle) by type."""
    if isinstance(x, torch.Tensor):
        return ("tensor", tuple(x.shape), x.stride(), str(x.dtype), x.device.type)
    if isinstance(x, (list, tuple)):
        return tuple(describe(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, describe(v)) for k, v in x.items()))
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(x)
    return type(x).__name__


def _names_a_device(name: str, args: tuple, kwargs: dict, counter: StepCounter) -> bool:
    """Whether a ``.to(...)``/``.cuda(...)`` call moves a tensor to a device (not just a dtype)."""
    if name == "cuda":
        return True
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        return counter.is_on_device(target)
    return isinstance(target, (torch.device, str))


def _non_blocking(args: tuple, kwargs: dict) -> bool:
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    flags = [a for a in args if isinstance(a, bool)]
    return bool(flags and flags[0])


def _in_backward(name: str) -> bool:
    """An ``index_put`` the autograd engine runs (the backward of ``x[host_index]``): CUDA's sync
    detector on an H200 (torch 2.11) flagged the forward's host index and not this one."""
    return name != "aten.index.Tensor" and torch._C._current_graph_task_id() != -1


def _check_errors(func: Any, args: tuple, kwargs: dict) -> bool:
    """The ``check_errors`` argument of a ``linalg_*_ex`` op (its schema default if not given)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "check_errors":
            if "check_errors" in kwargs:
                return bool(kwargs["check_errors"])
            return bool(args[i]) if i < len(args) else bool(arg.default_value)
    return True


def _collective_io(name: str, args: tuple) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(tensors this rank sends, tensors it receives) of a c10d op."""
    if name.split(".")[1] in _OUT_IN_OPS:  # (outputs, inputs, ...)
        return _tensors(args[1]), _tensors(args[0])
    return _tensors(args[0]), _tensors(args[0])  # in place: allreduce_, broadcast_, ...


def _layout(t: torch.Tensor) -> str:
    """The memory layout a collective's raw byte copy sees."""
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return "strided"


def _tensors(x: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def short_path(path: str) -> str:
    """``path`` relative to the checkout, or to its site-packages folder."""
    short = path.split("site-packages/")[-1]
    return os.path.relpath(short, ROOT) if short.startswith(str(ROOT)) else short


def innermost_frame(
    frames: Iterable[tuple[str, int, str]], skip: tuple[str, ...] = (), project_only: bool = True
) -> str | None:
    """The first of ``frames`` (file, line, function; innermost first) outside torch and the
    files ending in ``skip`` (with ``project_only``, in this checkout's code, not its
    site-packages): where an op or a sync was asked for."""
    for path, line, name in frames:
        if "/torch/" in path or path.endswith(skip):
            continue
        if project_only and (not path.startswith(str(ROOT)) or "site-packages" in path):
            continue
        return f"{short_path(path)}:{line} ({name})"
    return None


def _caller(project_only: bool = False) -> str:
    # a walk of the live frames: no source line is read (extract_stack's cost, once per op)
    frame = sys._getframe(1)
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return innermost_frame(frames, _COUNTING_FILES, project_only) or "?"
