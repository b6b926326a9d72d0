"""Training plumbing of the linear probe and semi-supervised fine-tuning: detectron2's
``SimpleTrainer`` and hooks, on CPU or GPU, in one process or under ``launch`` (training data
sharded by ``DistributedSampler``, evaluation by a strided split whose counts are summed).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from detectron2.engine import SimpleTrainer, hooks
from detectron2.solver import LRMultiplier
from detectron2.utils import comm
from detectron2.utils.events import JSONWriter
from fvcore.common.checkpoint import Checkpointer
from fvcore.common.config import CfgNode
from fvcore.common.param_scheduler import (
    CosineParamScheduler,
    MultiStepParamScheduler,
    ParamScheduler,
)
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler, Subset

from pretrain.data.datasets import TransformedDataset
from pretrain.engine.hooks import MetricPrinter, StopOnSignal
from pretrain.utils.checkpoint_fit import StrictShapes
from pretrain.utils.errors import ConfigError
from pretrain.utils.progress import progress
from pretrain.utils.signals import STOP, shield_data_worker
from transfer.classification.metrics import topk_hits
from transfer.classification.transforms import eval_transform, train_transform

__all__ = [
    "build_schedule",
    "evaluate_topk",
    "infinite_batches",
    "iters_per_epoch",
    "resolve_device",
    "run_training",
    "supervised_sets",
    "train_supervised",
    "wrap_ddp",
]

logger = logging.getLogger(__name__)


def resolve_device(name: str = "") -> torch.device:
    """``name`` if given, else this process's GPU when CUDA is available, else the CPU; a CUDA
    device this process cannot see is a :class:`ConfigError` (a GPU job must not run on CPU)."""
    if name:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise ConfigError(f"device {name!r}: not a torch device (cpu, cuda, cuda:1)") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(
                f"device {name!r} but CUDA is not visible to this process (no GPU, no driver, or "
                "CUDA_VISIBLE_DEVICES hides them): run where a GPU is visible, or use --device cpu"
            )
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", comm.get_local_rank())
    return torch.device("cpu")


def wrap_ddp(module: nn.Module, device: torch.device) -> nn.Module:
    """``DistributedDataParallel(module)`` when more than one process runs, else ``module``."""
    if comm.get_world_size() == 1:
        return module
    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)


def per_process_batch(batch_size: int) -> int:
    world = comm.get_world_size()
    if batch_size % world:
        raise ValueError(f"batch size {batch_size} is not divisible by {world} processes")
    return batch_size // world


def iters_per_epoch(num_samples: int, batch_size: int) -> int:
    """Full batches of ``batch_size`` (total over processes) in one epoch, at least 1."""
    return max(1, num_samples // batch_size)


def infinite_batches(
    dataset: Dataset, batch_size: int, num_workers: int = 0, seed: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless shuffled ``(images, labels)`` batches of this process's shard, epoch by epoch
    (``batch_size``: the total over processes)."""
    bs = per_process_batch(batch_size)
    if comm.get_world_size() > 1:
        sampler = DistributedSampler(dataset, shuffle=True, seed=seed, drop_last=True)
        shard = len(sampler)
    else:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
        shard = len(dataset)
    loader = DataLoader(
        dataset,
        batch_size=bs,
        sampler=sampler,
        num_workers=num_workers,
        drop_last=shard >= bs,  # tiny test sets still give one (partial) batch
        pin_memory=torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
        worker_init_fn=shield_data_worker,  # Ctrl-C and SLURM's signals are the trainer's
    )
    epoch = 0
    while True:
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def build_schedule(solver: CfgNode, max_iter: int) -> ParamScheduler:
    """Multiplier of the base lr: cosine to 0, or x GAMMA at each fraction of ``SOLVER.STEPS``."""
    if solver.SCHEDULE == "cosine":
        return CosineParamScheduler(1.0, 0.0)
    milestones = sorted({min(max_iter - 1, max(1, round(f * max_iter))) for f in solver.STEPS})
    milestones = [m for m in milestones if 0 < m < max_iter]
    values = [solver.GAMMA**i for i in range(len(milestones) + 1)]
    return MultiStepParamScheduler(values, num_updates=max_iter, milestones=milestones)


@torch.no_grad()
def evaluate_topk(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    dataset: Dataset,
    device: torch.device,
    batch_size: int = 256,
    num_workers: int = 0,
    desc: str = "eval",
) -> dict[str, float]:
    """Top-1 / top-5 accuracy (fractions) of ``logits_fn`` over ``dataset``, all processes."""
    world, rank = comm.get_world_size(), comm.get_rank()
    shard = Subset(dataset, range(rank, len(dataset), world))
    loader = DataLoader(shard, batch_size=batch_size, num_workers=num_workers)
    counts = torch.zeros(3, dtype=torch.float64, device=device)  # top1 hits, top5 hits, n
    for images, labels in progress(
        loader, desc=desc, unit="batch", disable=not comm.is_main_process()
    ):
        logits = logits_fn(images.to(device, non_blocking=True))
        labels = labels.to(device)
        counts[:2] += topk_hits(logits, labels, (1, 5)).sum(dim=0)
        counts[2] += len(labels)
    if world > 1:
        torch.distributed.all_reduce(counts)
    if counts[2] == 0:
        raise ValueError(f"{desc}: evaluation set is empty")
    result = {"top1": (counts[0] / counts[2]).item(), "top5": (counts[1] / counts[2]).item()}
    logger.info(
        "%s: %d images, top-1 %.2f%%, top-5 %.2f%%",
        desc,
        int(counts[2].item()),
        100 * result["top1"],
        100 * result["top5"],
    )
    return result


class _Checkpointer(StrictShapes, Checkpointer):
    """fvcore's checkpointer; a resumed tensor of another shape is an error (StrictShapes)."""


def run_training(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterator,
    max_iter: int,
    schedule: ParamScheduler,
    cfg: CfgNode,
    eval_fn: Callable[[], dict[str, float]],
    checkpoint_model: nn.Module | None = None,
    resume: bool = False,
    output_dir: str = "",
    eval_period: int | None = None,
) -> dict[str, float]:
    """Train ``model`` (returns a loss dict) for ``max_iter`` steps; returns the last eval.

    ``checkpoint_model`` (e.g. the linear head) is saved with the optimizer and scheduler every
    ``SOLVER.CHECKPOINT_PERIOD`` iterations, at the end, and after Ctrl-C (then exit 130);
    ``resume`` continues from ``output_dir``'s last checkpoint. ``eval_fn`` runs every
    ``eval_period`` iterations (default ``cfg.TEST.EVAL_PERIOD``; 0: only at the end).
    """
    output_dir = output_dir or cfg.OUTPUT_DIR
    if eval_period is None:
        eval_period = cfg.TEST.EVAL_PERIOD
    scheduler = LRMultiplier(optimizer, schedule, max_iter)
    trainer = SimpleTrainer(model, batches, optimizer)
    results: dict[str, float] = {}

    def _eval() -> dict[str, float]:
        results.update(eval_fn())
        return {f"eval/{k}": v for k, v in results.items()}

    hook_list = [hooks.IterationTimer(), hooks.LRScheduler(optimizer, scheduler)]
    checkpointer = None
    if checkpoint_model is not None:
        checkpointer = _Checkpointer(
            checkpoint_model,
            output_dir,
            save_to_disk=comm.is_main_process(),
            optimizer=optimizer,
            scheduler=scheduler,
        )
        period = cfg.SOLVER.get("CHECKPOINT_PERIOD", 0) or max_iter
        hook_list.append(hooks.PeriodicCheckpointer(checkpointer, period, max_iter=max_iter))
    hook_list.append(hooks.EvalHook(eval_period, _eval))
    if comm.is_main_process():
        writers = [
            MetricPrinter(max_iter),
            JSONWriter(os.path.join(output_dir, "metrics.json")),
        ]
        hook_list.append(hooks.PeriodicWriter(writers, period=cfg.LOG_PERIOD))
    if checkpointer is not None:
        # Ctrl-C only (SLURM requeues the tool with --resume). Last: its after_train restores
        # the handlers once the final evaluation is done.
        trainer.checkpointer = checkpointer
        hook_list.append(
            StopOnSignal(
                {signal.SIGINT: STOP},
                agree_every=cfg.LOG_PERIOD,
                each_step=True,
                resume="when the same command is run again with --resume",
            )
        )
    trainer.register_hooks(hook_list)
    start_iter = 0
    if resume and checkpointer is not None and checkpointer.has_checkpoint():
        start_iter = checkpointer.resume_or_load("", resume=True).get("iteration", -1) + 1
        logger.info("resuming from iteration %d", start_iter)
    trainer.train(start_iter, max_iter)
    return results


def supervised_sets(
    cfg: CfgNode,
    train_base: Dataset,
    val_base: Dataset,
    train_indices: Sequence[int] | None = None,
) -> tuple[TransformedDataset, TransformedDataset, int]:
    """``(train, val, max_iter)`` of the linear probe and of semi-supervised fine-tuning:
    ``train_base`` (only ``train_indices`` if given) through the training pipeline, ``val_base``
    through the evaluation one, ``SOLVER.MAX_ITER`` or else ``SOLVER.EPOCHS`` of full batches."""
    evt = eval_transform(cfg.INPUT.TEST_RESIZE, cfg.INPUT.TEST_CROP)
    train = TransformedDataset(train_base, train_transform(cfg.INPUT.TRAIN_CROP), train_indices)
    val = TransformedDataset(val_base, evt)
    s = cfg.SOLVER
    max_iter = s.MAX_ITER or s.EPOCHS * iters_per_epoch(len(train), s.BATCH_SIZE)
    return train, val, max_iter


def train_supervised(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    train_set: Dataset,
    max_iter: int,
    cfg: CfgNode,
    eval_fn: Callable[[], dict[str, float]],
    **kwargs: Any,
) -> dict[str, float]:
    """:func:`run_training` on endless batches of ``train_set`` (``SOLVER.BATCH_SIZE``, seeded by
    ``SEED``) with the schedule of ``SOLVER``; ``kwargs`` go to :func:`run_training`."""
    s = cfg.SOLVER
    batches = infinite_batches(train_set, s.BATCH_SIZE, cfg.DATA.NUM_WORKERS, cfg.SEED)
    schedule = build_schedule(s, max_iter)
    return run_training(model, optimizer, batches, max_iter, schedule, cfg, eval_fn, **kwargs)
