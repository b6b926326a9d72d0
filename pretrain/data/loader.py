"""The pretraining data path: deterministic per-iteration batches of uint8 multi-crop views
(``build_pretrain_loader``), and their last step on the model's device
(``augment_views_on_device``: colour augmentation and normalisation, run by the trainer).

Every random choice of iteration t is a function of (SEED, t, position in the global batch):
the sampler's per-sample seeds drive crops and colours, and each batch carries one ShuffleBN
seed per key crop (``shuffle_seeds``, the same on every process) for the model.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import shutil
from collections.abc import Iterator
from typing import Any

import torch
from fvcore.common.config import CfgNode
from torch.utils.data import DataLoader, Dataset

from pretrain.cluster.preemption import shield_data_worker
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

__all__ = [
    "PretrainDataset",
    "augment_views_on_device",
    "build_batch_augment",
    "build_pretrain_loader",
    "build_train_transform",
    "check_shared_memory",
    "collate_views",
    "shared_memory_need",
    "shuffle_seeds",
]

logger = logging.getLogger(__name__)

# Batches each worker prepares ahead (DataLoader's prefetch_factor): they wait in shared memory.
PREFETCH_FACTOR = 4


class PretrainDataset(Dataset):
    """Items are ``(index, augmentation_seed, iteration)`` triples from the batch sampler.

    An unreadable file is replaced by the next readable one (deterministically, so resumes stay
    exact) and its path is returned in ``skipped_files``; the trainer warns once per file in the
    main process and logs the running count.
    """

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
                img = self.source.load(j)
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


def shuffle_seeds(run_seed: int, iteration: int, key_crops: int) -> list[int]:
    """The ShuffleBN permutation seed of each key crop at ``iteration``, equal on every process."""
    return [sample_seed(run_seed, iteration, -2 - crop) >> 16 for crop in range(key_crops)]


def collate_views(
    batch: list[dict[str, Any]], run_seed: int = 0, key_crops: int = 0
) -> dict[str, Any]:
    """Stack view ``v`` of every sample: ``views`` is a list of uint8 (B, 3, h_v, w_v);
    ``shuffle_seeds`` holds :func:`shuffle_seeds` for ``key_crops`` key crops."""
    n_views = len(batch[0]["views"])
    color = None
    if batch[0].get("color") is not None:  # per view: the ColorParams of every sample, stacked
        fields = [f.name for f in dataclasses.fields(ColorParams)]
        color = [
            ColorParams(
                **{f: torch.cat([getattr(b["color"][v : v + 1], f) for b in batch]) for f in fields}
            )
            for v in range(n_views)
        ]
    return {
        "color_params": color,
        "views": [torch.stack([b["views"][v] for b in batch]) for v in range(n_views)],
        "index": torch.tensor([b["index"] for b in batch]),
        "seeds": torch.tensor([b["seed"] for b in batch]),
        "iteration": batch[0]["iteration"],
        "shuffle_seeds": shuffle_seeds(run_seed, batch[0]["iteration"], key_crops),
        "skipped_files": [p for b in batch for p in b["skipped_files"]],
    }


class _WithIteration:
    """Adds the iteration number to each sampler item (the batch's ShuffleBN seeds need it)."""

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
    color = ColorSpec(
        jitter=tuple(inp.COLOR_JITTER),
        jitter_prob=inp.JITTER_PROB,
        grayscale_prob=inp.GRAYSCALE_PROB,
        blur_sigma=tuple(inp.BLUR_SIGMA),
        blur_prob=inp.BLUR_PROB,
    )
    return MultiCropTransform(crops, color, color_on_device=inp.COLOR_ON_DEVICE), color


def build_batch_augment(cfg: CfgNode) -> BatchColorAugment:
    """The device-side colour augmentation and normalisation of ``cfg.INPUT``'s colour spec."""
    return BatchColorAugment(build_train_transform(cfg)[1])


def augment_views_on_device(
    batch: dict[str, Any],
    augment: BatchColorAugment,
    device: torch.device | str,
    *,
    apply_color: bool,
) -> dict[str, Any]:
    """The data path's last step, on the model's device: the loader's uint8 views -> float32
    views, colour-augmented there when ``apply_color`` (INPUT.COLOR_ON_DEVICE), and normalised.

    The colour parameters are the loader's per-sample ``color_params`` (drawn in the workers from
    each sample's seed, so they do not depend on how the batch is split across processes);
    without them they are drawn from a generator seeded with the batch's first sample seed.
    Returns a copy of ``batch`` with the new ``views``.
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
) -> DataLoader:
    """A loader yielding this rank's share of iterations ``start_iter, start_iter + 1, ...``.

    ``source`` (default: built from ``cfg.DATASETS``) lets the trainer scan the dataset once.
    """
    source = build_source(cfg, "train") if source is None else source
    transform, color = build_train_transform(cfg)
    sampler = IterationBatchSampler(
        len(source), cfg.SOLVER.IMS_PER_BATCH, rank, world_size, cfg.SEED, start_iter
    )
    workers = cfg.DATALOADER.NUM_WORKERS
    return DataLoader(
        PretrainDataset(source, transform, color if cfg.INPUT.COLOR_ON_DEVICE else None),
        batch_sampler=_WithIteration(sampler),
        num_workers=workers,
        collate_fn=functools.partial(
            collate_views, run_seed=cfg.SEED, key_crops=cfg.INPUT.KEY_CROPS
        ),
        pin_memory=cfg.MODEL.DEVICE == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=PREFETCH_FACTOR if workers > 0 else None,
        # SLURM signals every process of the job: the workers leave the stop to the main process
        worker_init_fn=shield_data_worker if workers > 0 else None,
    )


def shared_memory_need(cfg: CfgNode, world_size: int, procs_on_machine: int = 1) -> int:
    """Bytes of shared memory (``/dev/shm``) the data workers of ``procs_on_machine`` processes
    fill at once: each worker's prefetched batches of this process's share of the global batch,
    every view a uint8 (3, size, size) tensor (colour parameters and indices are negligible)."""
    workers = cfg.DATALOADER.NUM_WORKERS
    inp = cfg.INPUT
    per_image = 3 * (inp.LARGE_CROPS * inp.LARGE_SIZE**2 + inp.SMALL_CROPS * inp.SMALL_SIZE**2)
    batch = cfg.SOLVER.IMS_PER_BATCH // world_size
    return procs_on_machine * workers * PREFETCH_FACTOR * batch * per_image


def check_shared_memory(
    cfg: CfgNode, world_size: int, procs_on_machine: int = 1, shm: str = "/dev/shm"
) -> str | None:
    """Warn (and return the warning) when ``shm`` is smaller than :func:`shared_memory_need`.

    Data workers hand their batches over in shared memory; when it is full they die with a bus
    error or "No space left on device" some time into the run (containers often give 64 MB).
    Nothing is checked without workers or without ``shm``.
    """
    if cfg.DATALOADER.NUM_WORKERS <= 0 or not os.path.isdir(shm):
        return None
    need = shared_memory_need(cfg, world_size, procs_on_machine)
    size = shutil.disk_usage(shm).total
    if size >= need:
        return None
    msg = (
        f"{shm} holds {size / 2**20:.1f} MiB but the data loaders need about "
        f"{need / 2**20:.1f} MiB ({procs_on_machine} process(es) x DATALOADER.NUM_WORKERS "
        f"{cfg.DATALOADER.NUM_WORKERS} x {PREFETCH_FACTOR} prefetched batches of "
        f"{cfg.SOLVER.IMS_PER_BATCH // world_size} images' uint8 views): workers may die with a "
        f"bus error; enlarge {shm} (docker --shm-size) or lower DATALOADER.NUM_WORKERS"
    )
    logger.warning(msg)
    return msg
