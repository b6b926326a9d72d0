"""Training plumbing of the linear probe, semi-supervised fine-tuning and the augmented
transfer: detectron2's ``SimpleTrainer`` and hooks, on CPU or GPU, in one process or under
``launch`` (each process takes its share of the global batch of pretraining's sampler,
evaluation a strided split whose counts are summed).

Resumes are exact, as pretraining's: iteration t's images and augmentations depend on (SEED, t)
only (:func:`infinite_batches`), checkpoints hold the weights, optimizer, scheduler, iteration
and random generators (:func:`run_training`), and a sweep's finished stages are read back
(:func:`run_stage`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import yaml
from detectron2.engine import SimpleTrainer, hooks
from detectron2.solver import LRMultiplier
from detectron2.utils import comm
from detectron2.utils.events import EventStorage
from fvcore.common.config import CfgNode
from fvcore.common.param_scheduler import (
    CosineParamScheduler,
    MultiStepParamScheduler,
    ParamScheduler,
)
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, Subset

from pretrain.data.datasets import TransformedDataset, readable_loader, skipped_note
from pretrain.data.sampler import IterationBatchSampler
from pretrain.engine.checkpoint import AtomicCheckpointer
from pretrain.engine.hooks import Preempted, StopOnSignal
from pretrain.engine.writers import build_writers
from pretrain.utils.errors import ConfigError
from pretrain.utils.progress import progress
from pretrain.utils.rng_states import RngStates
from pretrain.utils.signals import STOP, shield_data_worker
from transfer.classification.metrics import topk_hits
from transfer.classification.transforms import eval_transform, train_transform
from transfer.run_dir import STAGE_RESULTS, RunDir

__all__ = [
    "STAGE_RESULTS",
    "build_schedule",
    "evaluate_topk",
    "infinite_batches",
    "iters_per_epoch",
    "resolve_device",
    "run_stage",
    "step_log",
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


class _SeededItems(Dataset):
    """``dataset[index]`` for the ``(index, seed)`` items of pretraining's
    :class:`~pretrain.data.sampler.IterationBatchSampler`, drawn with torch's CPU generator seeded
    by the item's own seed (torchvision's random transforms draw from it) and restored after:
    an image's augmentation depends on (SEED, iteration, position), not on what ran before."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]) -> Any:
        index, seed = item
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.dataset[index]


def infinite_batches(
    dataset: Dataset, batch_size: int, num_workers: int = 0, seed: int = 0, start_iter: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless shuffled ``(images, labels)`` batches of this process's share (``batch_size``:
    the total over processes) from iteration ``start_iter`` on: pretraining's sampler, so that
    iteration ``t``'s images and augmentations are a function of (``seed``, ``t``) alone and a
    resumed run sees what the uninterrupted one saw, on any number of processes. An epoch
    smaller than one batch is one smaller batch (tiny test sets)."""
    per_process_batch(batch_size)
    world = comm.get_world_size()
    sampler = IterationBatchSampler(
        len(dataset), min(batch_size, len(dataset)), comm.get_rank(), world, seed, start_iter
    )
    loader = readable_loader(  # an unreadable image is left out of its batch, with a warning
        _SeededItems(dataset),
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=num_workers > 0,
        worker_init_fn=shield_data_worker,  # Ctrl-C and SLURM's signals are the trainer's
    )
    yield from (batch for batch in loader if batch is not None)


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
    loader = readable_loader(shard, batch_size=batch_size, num_workers=num_workers)
    counts = torch.zeros(3, dtype=torch.float64, device=device)  # top1 hits, top5 hits, n
    for batch in progress(loader, desc=desc, unit="batch", disable=not comm.is_main_process()):
        if batch is None:  # every image of the batch unreadable
            continue
        images, labels = batch
        logits = logits_fn(images.to(device, non_blocking=True))
        labels = labels.to(device)
        counts[:2] += topk_hits(logits, labels, (1, 5)).sum(dim=0)
        counts[2] += len(labels)
    if world > 1:
        torch.distributed.all_reduce(counts)
    if counts[2] == 0:
        raise ValueError(f"{desc}: evaluation set is empty")
    note = skipped_note(desc, len(dataset), int(counts[2].item()))
    if note and comm.is_main_process():
        logger.warning(note)
    result = {"top1": (counts[0] / counts[2]).item(), "top5": (counts[1] / counts[2]).item()}
    logger.info(
        "%s: %d images, top-1 %.2f%%, top-5 %.2f%%",
        desc,
        int(counts[2].item()),
        100 * result["top1"],
        100 * result["top5"],
    )
    return result


def run_training(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Callable[[int], Iterable],
    max_iter: int,
    schedule: ParamScheduler,
    cfg: CfgNode,
    eval_fn: Callable[[], dict[str, float]],
    checkpoint_model: nn.Module | None = None,
    resume: bool = False,
    output_dir: str = "",
    eval_period: int | None = None,
    checkpoint_period: int | None = None,
    log_to: Sequence[str] = (),
) -> dict[str, float]:
    """Train ``model`` (returns a loss dict) for ``max_iter`` steps on ``batches(start_iter)``;
    returns the last eval.

    ``checkpoint_model`` (e.g. the linear head) is saved with the optimizer, scheduler and RNG
    states every ``SOLVER.CHECKPOINT_PERIOD`` iterations, at the end, and after Ctrl-C (then exit
    130); ``resume`` continues from ``output_dir``'s last checkpoint, ``batches`` from the
    iteration after it: with batches that are a function of the iteration
    (:func:`infinite_batches`) the resumed run is the uninterrupted one, bit for bit.
    ``eval_fn`` runs every ``eval_period`` iterations (default ``cfg.TEST.EVAL_PERIOD``; 0: only
    at the end); the writers are :func:`~pretrain.engine.writers.build_writers`' (``log_to``).
    ``checkpoint_period`` replaces ``SOLVER.CHECKPOINT_PERIOD`` (configs without ``SOLVER``).
    """
    output_dir = output_dir or cfg.OUTPUT_DIR
    if eval_period is None:
        eval_period = cfg.TEST.EVAL_PERIOD
    scheduler = LRMultiplier(optimizer, schedule, max_iter)
    checkpointer, start_iter = _checkpointer(checkpoint_model, optimizer, scheduler, output_dir), 0
    if checkpointer is not None and resume and checkpointer.has_checkpoint():
        start_iter = checkpointer.resume_or_load("", resume=True).get("iteration", -1) + 1
        logger.info("resuming from iteration %d", start_iter)
    trainer = SimpleTrainer(model, _From(batches, start_iter), optimizer)
    results: dict[str, float] = {}

    def _eval() -> dict[str, float]:
        results.update(eval_fn())
        return {f"eval/{k}": v for k, v in results.items()}

    hook_list = [hooks.IterationTimer(), hooks.LRScheduler(optimizer, scheduler)]
    if checkpointer is not None:
        if checkpoint_period is None:
            checkpoint_period = cfg.get("SOLVER", {}).get("CHECKPOINT_PERIOD", 0)
        period = checkpoint_period or max_iter
        hook_list.append(hooks.PeriodicCheckpointer(checkpointer, period, max_iter=max_iter))
    hook_list.append(hooks.EvalHook(eval_period, _eval))
    if comm.is_main_process():
        config = yaml.safe_load(cfg.dump())
        writers = build_writers(output_dir, max_iter, log_to, config=config)
        hook_list.append(hooks.PeriodicWriter(writers, period=cfg.LOG_PERIOD))
    stop = None
    if checkpointer is not None:
        # Ctrl-C only (SLURM requeues the tool with --resume). Last: its after_train restores
        # the handlers once the final evaluation is done.
        trainer.checkpointer = checkpointer
        stop = StopOnSignal(
            {signal.SIGINT: STOP},
            agree_every=cfg.LOG_PERIOD,
            each_step=True,
            resume=_RESUME,
        )
        hook_list.append(stop)
    trainer.register_hooks(hook_list)
    trainer.train(start_iter, max_iter)
    if stop is not None and stop.agreed_pending():
        # Ctrl-C in the last iteration or the final evaluation: this training is complete and
        # saved, the tool stops before its next one (a sweep's next lr, dataset or table)
        message = (
            f"stopped after iteration {max_iter - 1}, the last of this training (SIGINT); "
            f"resumes from {checkpointer.get_checkpoint_file()} {_RESUME}"
        )
        print(message, file=sys.stderr, flush=True)
        raise Preempted(message, 128 + signal.SIGINT)
    return results


_RESUME = "when the same command is run again with --resume"


def _checkpointer(
    model: nn.Module | None, optimizer: torch.optim.Optimizer, scheduler: Any, output_dir: str
) -> AtomicCheckpointer | None:
    """The checkpointer of ``model`` (None: nothing is checkpointed) with everything an exact
    resume needs besides the data order (a function of the iteration)."""
    if model is None:
        return None
    return AtomicCheckpointer(
        model,
        output_dir,
        save_to_disk=comm.is_main_process(),
        optimizer=optimizer,
        scheduler=scheduler,
        rng=RngStates(),
    )


class _From:
    """``batches(start)``, built when the trainer first iterates (after a resume set ``start``)."""

    def __init__(self, batches: Callable[[int], Iterable], start: int) -> None:
        self.batches, self.start = batches, start

    def __iter__(self) -> Iterator:
        return iter(self.batches(self.start))


@contextlib.contextmanager
def step_log(
    output_dir: str, max_iter: int, log_to: Sequence[str] = (), config: CfgNode | None = None
) -> Iterator[Callable[[int, dict[str, float]], None]]:
    """``log(iteration, scalars)`` for a training loop of its own (the cached-features
    classifiers): the scalars go through :func:`~pretrain.engine.writers.build_writers`' writers
    into ``output_dir`` (no console line: the loop shows a progress bar), as the engine's do."""
    writers = []
    if comm.is_main_process():
        cfg = yaml.safe_load(config.dump()) if config is not None else None
        writers = build_writers(output_dir, max_iter, log_to, config=cfg, console=False)
    with EventStorage() as storage:

        def log(iteration: int, scalars: dict[str, float]) -> None:
            storage.iter = iteration
            storage.put_scalars(**scalars, smoothing_hint=False)
            for writer in writers:
                writer.write()

        try:
            yield log
        finally:
            for writer in writers:
                writer.close()


def run_stage(
    directory: str, work: Callable[[], dict[str, Any]], results: str = STAGE_RESULTS
) -> dict[str, Any]:
    """The results of one stage of a sweep (one lr of the semi-supervised sweep, one search point
    of the transfer harness or of fine-tuning): read from ``directory/results`` when a resumed
    run finished it before, else ``work()``'s, written there atomically (main process) before
    the next stage starts."""
    stage = RunDir(directory, results=results)
    if stage.finished():
        with open(os.path.join(directory, results)) as f:
            logger.info("%s: finished before, results read from %s", directory, results)
            return json.load(f)["results"]
    results = work()
    if comm.is_main_process():
        stage.write_results(results)
    comm.synchronize()
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

    def batches(start: int) -> Iterator:
        return infinite_batches(train_set, s.BATCH_SIZE, cfg.DATA.NUM_WORKERS, cfg.SEED, start)

    schedule = build_schedule(s, max_iter)
    return run_training(model, optimizer, batches, max_iter, schedule, cfg, eval_fn, **kwargs)
