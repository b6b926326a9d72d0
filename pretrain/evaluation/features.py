"""Frozen-feature extraction: the one loop that embeds labelled images for kNN and probes
(:func:`embed`), its usual case over a dataset (:func:`extract_features`) and its distributed
form (:func:`gather_embeddings`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import torch
from detectron2.utils import comm
from torch import nn
from torch.utils.data import Dataset

from pretrain.data.datasets import readable_loader, skipped_note
from pretrain.utils.progress import progress

__all__ = [
    "FeatureFn",
    "GatheredEmbeddings",
    "batch_shards",
    "embed",
    "extract_features",
    "gather_embeddings",
    "module_feature_fn",
]

logger = logging.getLogger(__name__)

FeatureFn = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def embed(
    feature_fn: FeatureFn, loader: Iterable, desc: str | None = None, *, allow_empty: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (N, D) float32 on CPU, labels (N,) int64)`` of every ``(images, labels)``
    batch of ``loader``, with a progress bar when ``desc`` is given. No batch is an error unless
    ``allow_empty`` (a process's share of a small set may be empty). The images a
    :func:`~pretrain.data.datasets.readable_loader` left out are counted in one warning."""
    feats, labels = [], []
    batches = progress(loader, desc=desc, unit="batch", disable=desc is None)
    for batch in batches:
        if batch is None:  # every image of the batch unreadable (readable_loader)
            continue
        images, targets = batch
        feats.append(feature_fn(images).flatten(1).float().cpu())
        labels.append(torch.as_tensor(targets, dtype=torch.int64))
    dataset = getattr(loader, "dataset", None)
    if dataset is not None:
        note = skipped_note(desc or "features", len(dataset), sum(len(y) for y in labels))
        if note:
            logger.warning(note)
    if not feats:
        if allow_empty:
            return torch.zeros(0, 0), torch.zeros(0, dtype=torch.int64)
        raise ValueError(f"{desc or 'features'}: no images, nothing to extract")
    return torch.cat(feats), torch.cat(labels)


def batch_shards(counts: Sequence[int], batch_size: int, rank: int, world_size: int) -> list[range]:
    """Positions of each set (``range(counts[i])``) that process ``rank`` of ``world_size``
    embeds: the single process's batches, dealt out whole, a contiguous run (lengths differing by
    at most one batch) to each process, so that the shares in rank order give the set back and a
    loader over a share yields exactly the single process's batches.
    """
    if min(counts, default=0) < 0 or batch_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"need counts >= 0, batch_size >= 1, 0 <= rank < world_size; got counts={counts}, "
            f"batch_size={batch_size}, rank={rank}, world_size={world_size}"
        )
    batches = [-(-n // batch_size) for n in counts]
    total = sum(batches)
    first, last = rank * total // world_size, (rank + 1) * total // world_size  # of all batches
    shares, offset = [], 0
    for n, b in zip(counts, batches, strict=True):
        lo, hi = min(max(first - offset, 0), b), min(max(last - offset, 0), b)
        shares.append(range(min(lo * batch_size, n), min(hi * batch_size, n)))
        offset += b
    return shares


class GatheredEmbeddings(NamedTuple):
    """What :func:`gather_embeddings` returns on the destination process."""

    sets: list[tuple[torch.Tensor, torch.Tensor]]  # per loader: (features (N, D), labels (N,))
    seconds: list[float]  # per process (rank order): time spent embedding its shares


def gather_embeddings(
    feature_fn: FeatureFn, loaders: Sequence[Iterable], dst: int = 0
) -> GatheredEmbeddings | None:
    """Embed this process's share of each set, then gather every process's shares (in rank
    order) and embedding times on process ``dst``; ``None`` on the others. Every process must
    call it; the one collective (``comm.gather``) comes after all the work.
    """
    start = time.perf_counter()
    shares = [embed(feature_fn, loader, allow_empty=True) for loader in loaders]
    seconds = time.perf_counter() - start
    per_rank = comm.gather((shares, seconds), dst=dst)
    if not per_rank:
        return None
    sets = []
    for i in range(len(loaders)):
        parts = [rank_shares[i] for rank_shares, _ in per_rank if len(rank_shares[i][1])]
        if not parts:
            raise ValueError(f"set {i}: no images on any process, nothing to extract")
        sets.append((torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])))
    return GatheredEmbeddings(sets, [sec for _, sec in per_rank])


def module_feature_fn(module: nn.Module, device: torch.device | str) -> FeatureFn:
    """``feature_fn`` running ``module`` in eval mode on ``device``, restoring its mode after."""

    def fn(images: torch.Tensor) -> torch.Tensor:
        was_training = module.training
        module.eval()
        try:
            return module(images.to(device, non_blocking=True))
        finally:
            module.train(was_training)

    return fn


def extract_features(
    model: nn.Module | FeatureFn,
    dataset: Dataset,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
    num_workers: int = 0,
    desc: str = "features",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (N, D) float32 on CPU, labels (N,) int64)`` of ``dataset``'s readable images
    in order (an unreadable one is skipped and counted: :func:`embed`), by ``model`` (left in
    eval mode) or by a ``feature_fn`` that handles device and mode."""
    device = torch.device(device)
    loader = readable_loader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
    )
    if isinstance(model, nn.Module):
        model.eval()
        fn: FeatureFn = lambda x: model(x.to(device, non_blocking=True))  # noqa: E731
    else:
        fn = model
    with torch.inference_mode():
        return embed(fn, loader, desc)
