"""What one non-logging pretraining iteration asks of the device, counted on the CPU.

:func:`measure` builds the trainer from a shipped config shrunk to tiny images (the view layout,
model, loss, optimiser and hooks stay as shipped) and counts with a
:class:`~pretrain.diagnostics.op_counter.StepCounter` one iteration that neither logs nor
checkpoints, hooks included and the data fetch excluded (the loader's decoding and cropping run
on the host on a GPU too). The model's parameters and buffers, the optimiser's state and the
loader's views are device tensors; parameters drawn on the host (colour augmentation's,
ShuffleBN's permutation) stay host tensors, as on a GPU. Where the code takes another path on
the CPU than on a GPU (colour augmentation in cache-sized chunks; the nuclear norm's "auto"
eigensolver), the count takes the GPU's. ``benchmarks/bench_step.py`` prints it for the shipped
configs.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from detectron2.engine import HookBase, launch
from detectron2.utils import comm
from PIL import Image

import pretrain.engine.trainer as trainer_module
import pretrain.losses.nuclear as nuclear_module
from pretrain.config import load_config
from pretrain.diagnostics.op_counter import ROOT, StepCounter
from pretrain.engine.trainer import PretrainTrainer

__all__ = ["COUNTED_ITER", "measure", "toy_opts"]

COUNTED_ITER = 2  # warm (not the first), neither logging nor checkpointing
PER_PROC_BATCH = 8


def toy_opts(tmp: Path, keys: dict, extra: Sequence = (), per_class: int = 16, size: int = 40,
             images: bool = True) -> list[str]:  # fmt: skip
    """KEY VALUE overrides that train a shipped config on ``tmp``/data, an ImageFolder of 2 x
    ``per_class`` random RGB PNGs (made here unless not ``images``), writing to ``tmp``/out, the
    prior on from the first iteration and the kNN monitor off; ``keys`` (MODEL.DEVICE, sizes,
    batch ...) and ``extra`` (KEY VALUE): more or other values."""
    rng = np.random.default_rng(0)
    for c in range(2 if images else 0):
        (tmp / "data" / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp / "data" / f"c{c}" / f"{i}.png")
    opts = {"DATASETS.TYPE": "imagefolder", "DATASETS.ROOT": tmp / "data",
            "DATASETS.CLASS_LIST": "", "OUTPUT_DIR": tmp / "out", "LOSS.BETA_INF_EPOCHS": 0.0,
            "TEST.KNN_PERIOD": 0, **keys}  # fmt: skip
    return [str(x) for kv in opts.items() for x in kv] + [str(o) for o in extra]


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


def _count(config: str, opts: list[str], result_dir: str, device: str, record: tuple) -> None:
    torch.manual_seed(0)
    # the processes share the cores (the counts do not depend on threads)
    torch.set_num_threads(max(1, torch.get_num_threads() // comm.get_world_size()))
    trainer = PretrainTrainer(load_config(str(ROOT / config), opts))
    # the GPU's paths: colour augmentation as one pass per resolution, and the eigensolver the
    # nuclear norm's "auto" picks on a GPU (Jacobi for Q's few rows)
    trainer.color_augment.one_pass = True
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
    finally:  # in-process callers build real trainers afterwards
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


def measure(
    config: str,
    procs: int,
    device: str = "cpu",
    extra_opts: list[str] | None = None,
    record: tuple[int, ...] = (),
) -> dict:
    """Counts of rank 0 (and the other ranks' totals) for ``config`` (relative to the checkout)
    on ``procs`` processes; ``extra_opts``: more KEY VALUE overrides. With ``record`` (iteration
    numbers, none of them logging: SOLVER.MAX_ITER beyond them), the counts are those
    iterations' together and ``sequences`` holds each one's device ops and collectives, in
    order, with their arguments described (:func:`~pretrain.diagnostics.op_counter.describe`)."""
    with tempfile.TemporaryDirectory() as tmp:
        # 32 and 24 px, not 16: there a ResNet's layer4.0.conv1 sees 1x1 maps, where the CPU
        # bfloat16 weight gradient is wrong (pretrain.engine.launch.check_cpu_bfloat16)
        keys = {"MODEL.DEVICE": device, "INPUT.LARGE_SIZE": 32, "INPUT.SMALL_SIZE": 24,
                "MODEL.QUEUE_SIZE": 16 * PER_PROC_BATCH * procs,
                "SOLVER.IMS_PER_BATCH": PER_PROC_BATCH * procs,
                "SOLVER.MAX_ITER": COUNTED_ITER + 2, "SOLVER.CHECKPOINT_PERIOD": 1000,
                "SOLVER.LOG_PERIOD": 1000, "DATALOADER.NUM_WORKERS": 0}  # fmt: skip
        opts = toy_opts(Path(tmp), keys, extra_opts or ())
        results = Path(tmp) / "results"
        results.mkdir()
        args = (config, opts, str(results), device, record)
        launch(_count, procs, dist_url="auto", args=args)
        ranks = [json.loads((results / f"rank{r}.json").read_text()) for r in range(procs)]
    out = ranks[0]
    out["ops_per_rank"] = [r["ops"] for r in ranks]
    out["host_syncs_per_rank"] = [r["host_syncs"] for r in ranks]
    return out
