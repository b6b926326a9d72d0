"""The pretraining data path: deterministic per-iteration batches of uint8 multi-crop views
(``build_pretrain_loader``), and their last step on the model's device
(``augment_views_on_device``: colour augmentation and normalisation, run by the trainer).

Every random choice of iteration t is a function of (SEED, t, position in the global batch),
the ShuffleBN plans included (``shuffle_plans``). A worker decodes JPEGs straight into tensors
and collates each batch into one block of shared memory, which the main process maps without a
copy (:func:`collate_views`); ``benchmarks/bench_loader.py`` measures each stage.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from detectron2.utils import comm
from detectron2.utils.logger import log_first_n
from fvcore.common.config import CfgNode
from torch.utils.data import DataLoader, Dataset

from pretrain.config.step_policy import EAGER_STEP, StepPolicy
from pretrain.data.color import BatchColorAugment, ColorParams, ColorSpec, sample_color_params
from pretrain.data.datasets import (
    BadImageError,
    DatasetError,
    FashionMNISTSource,
    ImageFolderSource,
    build_source,
)
from pretrain.data.sampler import IterationBatchSampler, sample_seed
from pretrain.data.transforms import CropSpec, MultiCropTransform
from pretrain.utils.errors import ConfigError
from pretrain.utils.shuffle_plan import ShufflePlan, shuffle_plan
from pretrain.utils.signals import shield_data_worker

__all__ = [
    "AUTO_WORKERS",
    "PretrainDataset",
    "augment_views_on_device",
    "build_batch_augment",
    "build_pretrain_loader",
    "build_train_transform",
    "check_shared_memory",
    "collate_views",
    "resolve_num_workers",
    "shared_memory_need",
    "shuffle_plans",
]

logger = logging.getLogger(__name__)

# Batches each worker prepares ahead (DataLoader's prefetch_factor): they wait in shared memory.
PREFETCH_FACTOR = 4
# DATALOADER.NUM_WORKERS: as many workers as this process has cores, less one for itself
AUTO_WORKERS = -1
# Byte alignment of the tensors of a collated batch inside its one block of memory.
_ALIGN = 64


def resolve_num_workers(
    configured: int,
    procs_on_machine: int = 1,
    *,
    cores: set[int] | None = None,
    machine_cores: int | None = None,
    environ: Mapping[str, str] | None = None,
    name: str = "DATALOADER.NUM_WORKERS",
) -> int:
    """DATALOADER.NUM_WORKERS (or the setting ``name``) as a number of data workers per process.

    ``-1`` (:data:`AUTO_WORKERS`) counts the cores of this process's CPU affinity (``cores``),
    at most ``SLURM_CPUS_PER_TASK``; where the process sees every core of the machine, its
    ``procs_on_machine`` training processes share them (torchrun does not bind per process);
    then one less for the training process itself.
    """
    if configured >= 0:
        return configured
    if configured != AUTO_WORKERS:
        raise ConfigError(f"{name} = {configured}: a number >= 0, or -1 for one per core")
    if cores is None:
        cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    n = len(cores) if cores is not None else os.cpu_count() or 1
    slurm = (os.environ if environ is None else environ).get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        n = min(n, int(slurm))
    elif n >= (machine_cores or os.cpu_count() or n):
        n //= max(procs_on_machine, 1)
    return max(n - 1, 0)


def _num_workers(cfg: CfgNode, procs_on_machine: int) -> int:
    """:func:`resolve_num_workers` of the config, logged once per process when it was auto."""
    workers = resolve_num_workers(cfg.DATALOADER.NUM_WORKERS, procs_on_machine)
    if cfg.DATALOADER.NUM_WORKERS == AUTO_WORKERS:
        log_first_n(
            logging.INFO,
            f"DATALOADER.NUM_WORKERS -1: {workers} data workers per process (the cores of this "
            f"process's CPU affinity, {procs_on_machine} process(es) on this machine, less one "
            "for the training process)",
            key="message",
        )
    return workers


class PretrainDataset(Dataset):
    """Items are ``(index, augmentation_seed, iteration)`` triples from the batch sampler. An
    unreadable file is replaced by the next readable one (deterministically, so resumes stay
    exact) and reported in ``skipped_files``."""

    def __init__(
        self,
        source: ImageFolderSource | FashionMNISTSource,
        transform: MultiCropTransform,
        color: ColorSpec | None = None,
        max_consecutive_bad: int = 64,
    ) -> None:
        self.source, self.transform = source, transform
        self.color = color  # ColorSpec: draw this sample's device-side colour parameters here
        self.max_consecutive_bad = max_consecutive_bad

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, item: tuple[int, int, int]) -> dict[str, Any]:
        index, seed, iteration = item
        skipped: list[str] = []
        for attempt in range(self.max_consecutive_bad):
            j = (index + attempt) % len(self.source)
            try:
                img = self.source.load_rgb(j)  # a uint8 (H, W, 3) tensor: load(j)'s pixels
            except BadImageError as e:
                skipped.append(str(e))
                continue
            g = torch.Generator().manual_seed(seed)
            views = self.transform(img, g)
            # Per-sample colour parameters from the sample's own seed: the augmentation then does
            # not depend on how the global batch is split across processes (exact 1 vs N procs).
            color = sample_color_params(len(views), self.color, g) if self.color else None
            return {
                "views": views,
                "color": color,
                "index": j,
                "seed": seed,
                "iteration": iteration,
                "skipped_files": skipped,
            }
        raise DatasetError(
            f"{self.max_consecutive_bad} consecutive unreadable images starting at "
            f"{self.source.describe(index)}; is DATASETS.ROOT an image dataset?"
        )


def shuffle_plans(
    run_seed: int, iteration: int, key_crops: int, *, world: int, rank: int, b: int, splits: int
) -> list[ShufflePlan]:
    """The ShuffleBN plan of each key crop at ``iteration`` for process ``rank`` of ``world`` (``b``
    rows, ``splits`` BN groups each), from a seed of (SEED, iteration, key crop): every process
    draws the same global plan and keeps its part."""
    return [
        shuffle_plan(sample_seed(run_seed, iteration, -2 - crop) >> 16, world, b, splits, rank=rank)
        for crop in range(key_crops)
    ]


def _allocate(specs: list[tuple[tuple[int, ...], torch.dtype]], shared: bool) -> list[torch.Tensor]:
    """Uninitialised tensors of the given (shape, dtype)s, all in one block of memory; in shared
    memory with ``shared`` (as ``default_collate`` in a worker), so that the worker sends one
    handle, not a copy and a file descriptor per tensor."""
    offsets, size = [], 0
    for shape, dtype in specs:
        offsets.append(size)
        size += -(-math.prod(shape) * dtype.itemsize // _ALIGN) * _ALIGN
    if shared:
        block = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(size))
    else:
        block = torch.empty(size, dtype=torch.uint8)
    return [
        block[off : off + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
        for off, (shape, dtype) in zip(offsets, specs, strict=True)
    ]


def collate_views(
    batch: list[dict[str, Any]],
    run_seed: int = 0,
    key_crops: int = 0,
    *,
    shared_memory: bool = False,
    world: int = 1,
    rank: int = 0,
    splits: int = 1,
) -> dict[str, Any]:
    """Stack view ``v`` of every sample: ``views`` is a list of uint8 (B, 3, h_v, w_v), with
    ``color_params`` and the :func:`shuffle_plans` of ``key_crops`` key crops (0 where ShuffleBN
    does nothing); every tensor is written straight into one block (:func:`_allocate`).
    """
    first, n = batch[0], len(batch)
    n_views = len(first["views"])
    fields = []
    if first.get("color") is not None:  # per view: the ColorParams of every sample, stacked
        fields = list(first["color"].tensors)
    specs = [((n, *v.shape), v.dtype) for v in first["views"]]
    for f in fields:
        value = first["color"].tensors[f]  # (views, ...) of one sample
        specs.append(((value.shape[0], n, *value.shape[1:]), value.dtype))
    specs += [((n,), torch.int64), ((n,), torch.int64)]
    it = first["iteration"]
    plans = shuffle_plans(run_seed, it, key_crops, world=world, rank=rank, b=n, splits=splits)
    out = _allocate(specs + [(p.table.shape, p.table.dtype) for p in plans], shared_memory)
    out, tables = out[: len(specs)], out[len(specs) :]
    views, params, (index, seeds) = out[:n_views], out[n_views:-2], out[-2:]
    for v, dst in enumerate(views):
        torch.stack([b["views"][v] for b in batch], out=dst)
    for f, dst in zip(fields, params, strict=True):
        torch.stack([b["color"].tensors[f] for b in batch], dim=1, out=dst)
    index.copy_(torch.tensor([b["index"] for b in batch]))
    seeds.copy_(torch.tensor([b["seed"] for b in batch]))
    color = (
        [
            ColorParams(n, {f: p[v] for f, p in zip(fields, params, strict=True)})
            for v in range(n_views)
        ]
        if fields
        else None
    )
    return {
        "color_params": color,
        "views": views,
        "index": index,
        "seeds": seeds,
        "iteration": first["iteration"],
        "shuffle_plans": [
            dataclasses.replace(p, table=t.copy_(p.table))
            for p, t in zip(plans, tables, strict=True)
        ],
        "skipped_files": [p for b in batch for p in b["skipped_files"]],
    }


class _WithIteration:
    """Adds the iteration number to each sampler item (the batch's ShuffleBN plans need it)."""

    def __init__(self, sampler: IterationBatchSampler) -> None:
        self.sampler = sampler

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        for it, items in enumerate(self.sampler, start=self.sampler.start_iter):
            yield [(i, s, it) for i, s in items]


def build_train_transform(cfg: CfgNode) -> tuple[MultiCropTransform, ColorSpec]:
    """The worker-side multi-crop transform and the colour spec named by ``cfg.INPUT``."""
    inp = cfg.INPUT
    crops = [CropSpec(inp.LARGE_SIZE, tuple(inp.LARGE_SCALE), inp.LARGE_CROPS)]
    if inp.SMALL_CROPS:
        crops.append(CropSpec(inp.SMALL_SIZE, tuple(inp.SMALL_SCALE), inp.SMALL_CROPS))
    color = ColorSpec.from_cfg(inp)
    return MultiCropTransform(crops, color, color_on_device=inp.COLOR_ON_DEVICE), color


def build_batch_augment(cfg: CfgNode, policy: StepPolicy = EAGER_STEP) -> BatchColorAugment:
    """The device-side colour augmentation and normalisation of ``cfg.INPUT``'s colour spec; the
    training step's ``policy`` (the trainer's) says how ops pick samples."""
    return BatchColorAugment(build_train_transform(cfg)[1], pick=policy.pick)


def augment_views_on_device(
    batch: dict[str, Any],
    augment: BatchColorAugment | Callable[..., list[torch.Tensor]],
    device: torch.device | str,
    *,
    apply_color: bool,
) -> dict[str, Any]:
    """The data path's last step, on the model's device: the loader's uint8 views -> float32
    views, colour-augmented when ``apply_color`` (with the workers' ``color_params``, else drawn
    from the batch's first sample seed) and normalised; returns a copy of ``batch``.
    """
    views = [v.to(device, non_blocking=True) for v in batch["views"]]
    params = batch.get("color_params") if apply_color else None
    g = torch.Generator().manual_seed(int(batch["seeds"][0]) & 0xFFFFFFFFFFFF)
    return {**batch, "views": augment(views, g, apply_color=apply_color, params=params)}


def build_pretrain_loader(
    cfg: CfgNode,
    rank: int,
    world_size: int,
    start_iter: int,
    source: ImageFolderSource | FashionMNISTSource | None = None,
    procs_on_machine: int | None = None,
) -> DataLoader:
    """A loader yielding this rank's share of iterations ``start_iter, start_iter + 1, ...``
    (``source``: the dataset, scanned once by the caller)."""
    source = build_source(cfg, "train") if source is None else source
    transform, color = build_train_transform(cfg)
    sampler = IterationBatchSampler(
        len(source), cfg.SOLVER.IMS_PER_BATCH, rank, world_size, cfg.SEED, start_iter
    )
    procs = comm.get_local_size() if procs_on_machine is None else procs_on_machine
    workers = _num_workers(cfg, procs)
    # the model's uses_shuffle_plans: ShuffleBN across more than one BN group
    shuffles = cfg.MODEL.SHUFFLE_BN and world_size * cfg.MODEL.KEY_BN_SPLITS > 1
    return DataLoader(
        PretrainDataset(source, transform, color if cfg.INPUT.COLOR_ON_DEVICE else None),
        batch_sampler=_WithIteration(sampler),
        num_workers=workers,
        collate_fn=functools.partial(
            collate_views,
            run_seed=cfg.SEED,
            key_crops=cfg.INPUT.KEY_CROPS if shuffles else 0,
            world=world_size,
            rank=rank,
            splits=cfg.MODEL.KEY_BN_SPLITS,
            shared_memory=workers > 0,  # collated in a worker: straight into shared memory
        ),
        pin_memory=cfg.MODEL.DEVICE == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
        # SLURM signals every process of the job: the workers leave the stop to the main process
        worker_init_fn=shield_data_worker if workers > 0 else None,
    )


def shared_memory_need(cfg: CfgNode, world_size: int, procs_on_machine: int = 1) -> int:
    """Bytes of shared memory the data workers of ``procs_on_machine`` processes fill at once:
    each worker's prefetched batches of uint8 views (the rest is negligible)."""
    workers = resolve_num_workers(cfg.DATALOADER.NUM_WORKERS, procs_on_machine)
    inp = cfg.INPUT
    per_image = 3 * (inp.LARGE_CROPS * inp.LARGE_SIZE**2 + inp.SMALL_CROPS * inp.SMALL_SIZE**2)
    batch = cfg.SOLVER.IMS_PER_BATCH // world_size
    return procs_on_machine * workers * PREFETCH_FACTOR * batch * per_image


def check_shared_memory(
    cfg: CfgNode, world_size: int, procs_on_machine: int = 1, shm: str = "/dev/shm"
) -> str | None:
    """Warn (and return the warning) when ``shm`` is smaller than :func:`shared_memory_need`:
    workers that fill it die with a bus error some time into the run (containers often give
    64 MB)."""
    workers = resolve_num_workers(cfg.DATALOADER.NUM_WORKERS, procs_on_machine)
    if workers <= 0 or not os.path.isdir(shm):
        return None
    need = shared_memory_need(cfg, world_size, procs_on_machine)
    size = shutil.disk_usage(shm).total
    if size >= need:
        return None
    auto = " (-1: one per core)" if cfg.DATALOADER.NUM_WORKERS == AUTO_WORKERS else ""
    msg = (
        f"{shm} holds {size / 2**20:.1f} MiB but the data loaders need about "
        f"{need / 2**20:.1f} MiB ({procs_on_machine} process(es) x DATALOADER.NUM_WORKERS "
        f"{workers}{auto} x {PREFETCH_FACTOR} prefetched batches of "
        f"{cfg.SOLVER.IMS_PER_BATCH // world_size} images' uint8 views): workers may die with a "
        f"bus error; enlarge {shm} (docker --shm-size) or lower DATALOADER.NUM_WORKERS"
    )
    logger.warning(msg)
    return msg
