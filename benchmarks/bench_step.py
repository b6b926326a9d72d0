"""What one non-logging pretraining iteration asks of the device: ops, host syncs, collectives.

Builds the trainer from a shipped config, shrunk to tiny images (the view layout, model, loss,
optimiser and hooks stay as shipped), and counts with a ``TorchDispatchMode`` every aten op of
one iteration that is neither a logging nor a checkpointing one (hooks included, the data fetch
excluded: the loader's decoding and cropping run on the host on a GPU too). Only ops whose
inputs would live on the GPU count: the model's parameters and buffers, the optimiser's state,
the loader's views, and everything computed from them (tracked op by op); parameters drawn on
the host (colour augmentation's, ShuffleBN's permutation) stay host tensors, as on a GPU. On a
GPU every counted op is at least one kernel launch, and every host sync drains the launch
queue:

* ops: aten ops dispatched (views and metadata ops included, as the dispatcher sees them);
* host syncs: what makes the host wait for the device, with the source line each comes from:
  ops that read a device tensor's value on the host (``.item()``, ``bool(t)``, ``int(t)``,
  ``.tolist()``, ``nonzero``, ...), and the syncs a GPU makes *inside* ops, which Python never
  sees (:data:`HIDDEN_SYNCS`): linalg ops with error checks (their CUDA kernels read the
  ``info`` flags back), boolean-mask indexing (a ``nonzero`` inside), indexing a device tensor
  with host index tensors (a Python list becomes a host tensor, copied to the device with a
  blocking copy) and blocking host-to-device copies (``.to(device)``, ``torch.tensor(...,
  device=...)``, ``dst.copy_(host)`` and so ``t[i] = 5``, without ``non_blocking``; one element
  too, as CUDA's own sync detector showed on an H200);
* collectives: c10d ops (all_gather, all_reduce, broadcast ...), the bytes this rank sends and
  receives, and every collective whose input and output differ in memory layout (NCCL moves raw
  bytes: a channels_last input gathered into NCHW buffers, or the reverse, scrambles the data).

Where the code takes another path on the CPU than on a GPU (colour augmentation: views in
cache-sized chunks on the CPU, one pass per resolution elsewhere; the nuclear norm's eigensolver:
LAPACK's eigh on the CPU, Jacobi sweeps for Q's few rows on a GPU, ``LOSS.NUCLEAR_NORM auto``),
the count takes the GPU's.
The prior is switched on from the first iteration (``LOSS.BETA_INF_EPOCHS 0``) so that LORAC's
count includes it. Runs on CUDA too when ``--device cuda`` is given and a GPU is visible.

Run: .venv/bin/python -m benchmarks.bench_step [--config C ...] [--procs 1 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import tempfile
import traceback
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch
from detectron2.engine import HookBase, launch
from detectron2.utils import comm
from PIL import Image
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import pretrain.engine.trainer as trainer_module
import pretrain.losses.nuclear as nuclear_module
from pretrain.config import load_config
from pretrain.engine.trainer import PretrainTrainer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = [
    "configs/pretrain/in1k_r50_lorac_200ep.yaml",
    "configs/pretrain/in1k_r50_mocom_200ep.yaml",
    "configs/pretrain/in1k_r50_mocov2_200ep.yaml",
]
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
COUNTED_ITER = 2  # warm (not the first), neither logging nor checkpointing
PER_PROC_BATCH = 8


class StepCounter(TorchDispatchMode):
    """Counts device ops, host syncs (by source line) and collective bytes while not paused.

    A tensor is on the device when :meth:`mark` said so or an op computed it from one that is.
    Enter it with :meth:`watching`, which also enters its :class:`_DeviceCopies` companion (the
    function-level view: ``.to(device)`` of a host tensor is no op at all when the device is the
    CPU, yet a host-to-device copy on a GPU).
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
        # with a list here, every device op and collective is also appended as (name, described
        # arguments): the sequence a graph replay needs to be the same step after step
        self.sequence: list[tuple] | None = None
        # the step's inputs (ids): the values written into them (the learning rate) are what a
        # replay is fed, not part of what it replays: recorded as an input write, without them
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
        self.collective_bytes += sum(_nbytes(t) for t in sent)
        self.collective_bytes_received += sum(_nbytes(t) for t in received)
        self.received_by_source[f"{name} from {where}"] += sum(_nbytes(t) for t in received)
        layouts = {_layout(t) for t in [*sent, *received]}
        if len(layouts) > 1 or "strided" in layouts:
            self.layout_mismatches.append(f"{name} from {where}: {sorted(layouts)}")


class _DeviceCopies(TorchFunctionMode):
    """The host-to-device copies a GPU would make, seen where Python asks for them.

    ``t.to(device)`` (or ``.to(other)``, ``.cuda()``) of a host tensor, and ``torch.tensor(data,
    device=...)``: the result is a device tensor; the copy is a host sync unless it is
    ``non_blocking`` or copies a single element (CUDA copies a host scalar as a kernel argument).
    A non-blocking copy is counted apart, not as a sync (on CUDA the project's copies go through
    pinned memory: :func:`pretrain.utils.device.to_device`).
    Methods that hand a device tensor's values to Python (``tolist``, ``cpu``...) are syncs.
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
    it is a device tensor (not its values); numbers, lists of them (a collective's split sizes)
    and other plain values by value (a graph bakes them in); anything else (a process group, a
    work handle) by type."""
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
    op = name.split(".")[1]
    if op == "allgather_":  # (output lists, inputs, ...)
        return _tensors(args[1]), _tensors(args[0])
    if op in ("_allgather_base_", "alltoall_base_", "_reduce_scatter_base_"):
        return _tensors(args[1]), _tensors(args[0])  # (output, input, ...)
    if op in ("reduce_scatter_", "alltoall_"):  # (outputs, inputs, ...)
        return _tensors(args[1]), _tensors(args[0])
    return _tensors(args[0]), _tensors(args[0])  # in place: allreduce_, broadcast_, ...


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _layout(t: torch.Tensor) -> str:
    """The memory layout a collective's raw byte copy sees."""
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return "strided"


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _caller(project_only: bool = False) -> str:
    """The innermost frame outside torch and this file (with ``project_only``, the innermost
    in this project): where the op or sync was asked for."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        path = frame.filename
        if "/torch/" in path or path.endswith("bench_step.py"):
            continue
        if project_only and not path.startswith(str(ROOT)):
            continue
        short = path.split("site-packages/")[-1] if "site-packages" in path else path
        short = os.path.relpath(short, ROOT) if short.startswith(str(ROOT)) else short
        return f"{short}:{frame.lineno} ({frame.name})"
    return "?"


class _Start(HookBase):
    """Before every other hook of the iterations ``iters``: the counter starts (recording each
    iteration's op sequence when ``sequences`` is a dict)."""

    def __init__(
        self, counter: StepCounter, iters: tuple[int, ...], sequences: dict | None = None
    ) -> None:
        self.counter, self.iters, self.sequences = counter, iters, sequences

    def before_step(self) -> None:
        if self.trainer.iter in self.iters:
            trainer = self.trainer
            self.counter.mark([list(trainer.model.parameters()), list(trainer.model.buffers())])
            self.counter.mark(list(trainer.optimizer.state.values()))
            lrs = list(getattr(trainer.optimizer, "_lr_tensors", {}).values())  # device_lr
            self.counter.mark(lrs)
            self.counter.inputs = {id(t) for t in lrs}
            if self.sequences is not None:
                self.counter.sequence = self.sequences[self.trainer.iter] = []
            self.counter.__enter__()


class _Stop(HookBase):
    """After every other hook of the iterations ``iters``: the counter stops."""

    def __init__(self, counter: StepCounter, iters: tuple[int, ...]) -> None:
        self.counter, self.iters = counter, iters

    def after_step(self) -> None:
        if self.trainer.iter in self.iters:
            self.counter.__exit__(None, None, None)
            self.counter.sequence = None


def make_images(root: Path, classes: int = 2, per_class: int = 16, size: int = 40) -> Path:
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i}.png")
    return root


def tiny_opts(data: Path, out: Path, procs: int, device: str) -> list[str]:
    opts = {
        "DATASETS.TYPE": "imagefolder",
        "DATASETS.ROOT": str(data),
        "DATASETS.CLASS_LIST": "",
        "OUTPUT_DIR": str(out),
        "MODEL.DEVICE": device,
        "INPUT.LARGE_SIZE": 32,
        # not 16: there a ResNet's layer4.0.conv1 sees 1x1 maps, where the CPU bfloat16 weight
        # gradient is wrong (pretrain.engine.launch.check_cpu_bfloat16 refuses it)
        "INPUT.SMALL_SIZE": 24,
        "MODEL.QUEUE_SIZE": 16 * PER_PROC_BATCH * procs,
        "SOLVER.IMS_PER_BATCH": PER_PROC_BATCH * procs,
        "SOLVER.MAX_ITER": COUNTED_ITER + 2,
        "SOLVER.CHECKPOINT_PERIOD": 1000,
        "SOLVER.LOG_PERIOD": 1000,
        "DATALOADER.NUM_WORKERS": 0,
        "LOSS.BETA_INF_EPOCHS": 0.0,
        "TEST.KNN_PERIOD": 0,
    }
    return [str(x) for kv in opts.items() for x in kv]


class _UncountedLoader:
    """The loader, its batches produced with the counter paused (host work on a GPU too)."""

    def __init__(self, loader: Any, counter: StepCounter) -> None:
        self.loader, self.counter = loader, counter

    def __iter__(self):  # noqa: ANN204
        it = iter(self.loader)
        while True:
            self.counter.paused = True
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                self.counter.paused = False
            self.counter.mark(batch["views"])  # copied to the GPU in the step
            yield batch


def _count(
    config: str,
    opts: list[str],
    result_dir: str,
    device: str = "cpu",
    record: tuple[int, ...] = (),
) -> None:
    torch.manual_seed(0)
    cfg = load_config(str(ROOT / config), opts)
    trainer = PretrainTrainer(cfg)
    # the GPU's path where the code has a CPU one: colour augmentation as one pass per resolution
    # (code before 2026-11 had no such switch: there, one chunk per view, as its GPU path ran)
    if hasattr(trainer.color_augment, "one_pass"):
        trainer.color_augment.one_pass = True
    else:
        trainer.color_augment.cpu_chunk_pixels = 1 << 40
    # and the nuclear norm's eigensolver that "auto" picks on a GPU (Jacobi for Q's few rows)
    resolve = nuclear_module._resolve_method
    if device == "cpu":
        nuclear_module._resolve_method = lambda x, method: (
            nuclear_module.auto_method("cuda", min(x.shape[-2:])) if method == "auto" else method
        )
    counter = StepCounter()
    build_loader = trainer_module.build_pretrain_loader
    trainer_module.build_pretrain_loader = lambda *a: _UncountedLoader(build_loader(*a), counter)
    sequences: dict[int, list] = {}
    iters = tuple(record) or (COUNTED_ITER,)
    trainer._hooks.insert(0, _Start(counter, iters, sequences if record else None))
    trainer._hooks[0].trainer = trainer
    trainer.register_hooks([_Stop(counter, iters)])
    try:
        trainer.train()
    finally:  # in-process callers (the tests) build real trainers afterwards
        trainer_module.build_pretrain_loader = build_loader
        nuclear_module._resolve_method = resolve
    out = {
        "ops": counter.ops,
        "host_syncs": sum(counter.syncs.values()),
        "syncs_by_source": dict(counter.syncs),
        "async_copies": dict(counter.async_copies),
        "collectives": dict(counter.collectives),
        "collective_bytes": counter.collective_bytes,
        "collective_bytes_received": counter.collective_bytes_received,
        "collective_bytes_received_by_source": dict(counter.received_by_source),
        "layout_mismatches": counter.layout_mismatches,
        "top_ops": dict(counter.by_op.most_common(15)),
        "ops_by_source": dict(counter.by_source.most_common()),
        "sequences": {str(i): seq for i, seq in sequences.items()},
    }
    Path(result_dir, f"rank{comm.get_rank()}.json").write_text(json.dumps(out))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(
    config: str,
    procs: int,
    device: str = "cpu",
    extra_opts: list[str] | None = None,
    record: tuple[int, ...] = (),
) -> dict:
    """Counts of rank 0 (and the other ranks' totals) for ``config`` on ``procs`` processes;
    ``extra_opts``: more KEY VALUE overrides. With ``record`` (iteration numbers, none of them
    logging: SOLVER.MAX_ITER beyond them), the counts are those iterations' together and
    ``sequences`` holds each one's device ops and collectives, in order, with their arguments
    described (:func:`describe`)."""
    with tempfile.TemporaryDirectory() as tmp:
        data = make_images(Path(tmp) / "data")
        opts = tiny_opts(data, Path(tmp) / "out", procs, device) + list(extra_opts or [])
        results = Path(tmp) / "results"
        results.mkdir()
        if procs == 1:
            _count(config, opts, str(results), device, record)
        else:
            launch(
                _count,
                procs,
                dist_url=f"tcp://127.0.0.1:{_free_port()}",
                args=(config, opts, str(results), device, record),
            )
        ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in range(procs)]
    out = ranks[0]
    out["ops_per_rank"] = [r["ops"] for r in ranks]
    out["host_syncs_per_rank"] = [r["host_syncs"] for r in ranks]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=DEFAULT_CONFIGS, help="config file(s)")
    parser.add_argument("--procs", nargs="+", type=int, default=[1, 2], help="process counts")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--opts", nargs="*", default=[], help="KEY VALUE config overrides")
    parser.add_argument("--verbose", action="store_true", help="print the most frequent ops")
    args = parser.parse_args()
    torch.set_num_threads(1)
    report: dict[str, dict] = {}
    for config in args.config:
        for procs in args.procs:
            m = measure(config, procs, args.device, args.opts)
            report[f"{config} x{procs}"] = m
            print(
                f"{Path(config).stem} procs={procs}: ops={m['ops']} host_syncs={m['host_syncs']} "
                f"collectives={sum(m['collectives'].values())} "
                f"collective_bytes={m['collective_bytes']} "
                f"received={m['collective_bytes_received']}"
            )
            for where, n in sorted(m["syncs_by_source"].items()):
                print(f"    sync x{n}: {where}")
            received = m["collective_bytes_received_by_source"]
            for name, n in m["collectives"].items():
                print(f"    collective x{n}: {name} ({received.get(name, 0)} bytes received)")
            for where in m["layout_mismatches"]:
                print(f"    LAYOUT MISMATCH: {where}")
            for where, n in sorted(m["async_copies"].items()):
                print(f"    non-blocking host-to-device copy x{n}: {where}")
            if args.verbose:
                for name, n in m["ops_by_source"].items():
                    print(f"    ops x{n}: from {name}")
                for name, n in m["top_ops"].items():
                    print(f"    op x{n}: {name}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
