"""Frozen-feature extraction: the one loop that embeds labelled images for kNN and probes.

:func:`embed` runs any ``feature_fn`` over any loader of ``(images, labels)`` batches (the kNN
hook of pretraining passes its own loaders and the query backbone); :func:`extract_features` is
the usual case, a model in eval mode over a dataset in order, in inference mode with a
progress bar.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

__all__ = ["FeatureFn", "embed", "extract_features", "module_feature_fn"]

FeatureFn = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def embed(
    feature_fn: FeatureFn, loader: Iterable, desc: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (N, D) float32 on CPU, labels (N,) int64)`` of every ``(images, labels)``
    batch of ``loader``, in order; a progress bar (with ETA) is shown when ``desc`` is given."""
    feats, labels = [], []
    batches = tqdm(loader, desc=desc, unit="batch", dynamic_ncols=True, disable=desc is None)
    for images, targets in batches:
        feats.append(feature_fn(images).flatten(1).float().cpu())
        labels.append(torch.as_tensor(targets, dtype=torch.int64))
    if not feats:
        raise ValueError(f"{desc or 'features'}: no images, nothing to extract")
    return torch.cat(feats), torch.cat(labels)


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
    model: nn.Module,
    dataset: Dataset,
    device: torch.device | str = "cpu",
    batch_size: int = 256,
    num_workers: int = 0,
    desc: str = "features",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (N, D) float32 on CPU, labels (N,) int64)`` of ``dataset`` in order.

    ``model`` is switched to eval mode (and left there) and run in inference mode.
    """
    device = torch.device(device)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
    )
    model.eval()
    with torch.inference_mode():
        return embed(lambda x: model(x.to(device, non_blocking=True)), loader, desc)
