"""``TRANSFER.PROTOCOL augmented``: Table 2 as the paper describes it ("the same pre-processing
as the linear evaluation on ImageNet-1K"). Every step draws RandomResizedCrop + flip images
through the frozen backbone into the ImageNet linear probe's model (:class:`.probe.LinearProbe`)
on its engine, one head per lr of the sweep sharing each batch (summed losses: each head equals
one trained alone). Val and test are scored on centre crops, never stored.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from fvcore.common.config import CfgNode
from fvcore.common.param_scheduler import CosineParamScheduler
from torch import nn
from torch.utils.data import ConcatDataset, Dataset

from pretrain.data.datasets import TransformedDataset
from pretrain.evaluation.features import extract_features

from .backbone import EvalBackbone
from .engine import infinite_batches, run_training
from .features import check_index_labels
from .linear import classification_loss, linear_head
from .probe import LinearProbe
from .transfer_datasets import TransferData
from .transforms import eval_transform, train_transform

__all__ = [
    "LinearHeads",
    "SweepProbe",
    "centre_crop_features",
    "split_images",
    "train_heads_augmented",
]

logger = logging.getLogger(__name__)


class LinearHeads(nn.ModuleList):
    """``num_heads`` identical :func:`.linear.linear_head` s drawn with ``seed``; ``forward``
    stacks their logits."""

    def __init__(self, feature_dim: int, num_classes: int, num_heads: int, seed: int = 0) -> None:
        if num_heads < 1:
            raise ValueError(f"need at least one head, got {num_heads}")
        init = linear_head(feature_dim, num_classes, torch.Generator().manual_seed(seed))
        super().__init__([copy.deepcopy(init) for _ in range(num_heads)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([head(x) for head in self])  # (H, B, C)


class SweepProbe(LinearProbe):
    """:class:`.probe.LinearProbe` with :class:`LinearHeads`; the loss is the sum over heads."""

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        images, labels = batch
        logits = self.head(self.features(images))  # (H, B, C)
        labels = labels.to(self.device)
        return {"loss_cls": sum(classification_loss(z, labels) for z in logits)}


def split_images(
    data: TransferData, splits: Sequence[str], transform: Callable
) -> tuple[Dataset, torch.Tensor]:
    """The images of ``splits`` (e.g. ``("train", "val")``) with ``transform``, and their labels."""
    parts = [(src, idx) for split in splits for src, idx in data.splits[split]]
    sets = [TransformedDataset(data.sources[src], transform, idx.tolist()) for src, idx in parts]
    labels = np.concatenate([data.labels[src][idx] for src, idx in parts])
    dataset = sets[0] if len(sets) == 1 else ConcatDataset(sets)
    return dataset, torch.as_tensor(labels, dtype=torch.int64)


def centre_crop_features(
    data: TransferData, split: str, net: nn.Module, cfg: CfgNode, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs (N, D) of ``net`` (the backbone: features; a fine-tuned network: logits) and
    labels (N,) of ``split`` on the evaluation pipeline, not cached."""
    transform = eval_transform(cfg.INPUT.RESIZE, cfg.INPUT.CROP)
    dataset, expected = split_images(data, [split], transform)
    feats, labels = extract_features(
        net,
        dataset,
        device,
        cfg.FEATURES.BATCH_SIZE,
        cfg.FEATURES.NUM_WORKERS,
        desc=f"{data.key}/{split} centre crops",
    )
    check_index_labels(f"{data.key}/{split}", labels, expected)
    return feats, labels


def train_heads_augmented(
    data: TransferData,
    splits: Sequence[str],
    backbone: EvalBackbone,
    cfg: CfgNode,
    lrs: Sequence[float],
    iters: int,
    device: torch.device | str,
    output_dir: str,
    resume: bool = False,
    log_to: Sequence[str] = (),
) -> list[nn.Linear]:
    """One linear head per lr trained for ``iters`` steps on augmented images of ``splits``
    with the cached protocol's SGD and cosine schedule; logs and checkpoints go to
    ``output_dir`` (``resume``: continue its last checkpoint, exactly)."""
    t = cfg.TRANSFER
    dataset, _ = split_images(data, splits, train_transform(cfg.INPUT.CROP))
    heads = LinearHeads(backbone.feature_dim, data.num_classes, len(lrs), cfg.SEED)
    model = SweepProbe(backbone.model, heads, device)
    optimizer = torch.optim.SGD(
        [{"params": h.parameters(), "lr": lr} for h, lr in zip(model.classifier, lrs, strict=True)],
        lr=float(lrs[0]),
        momentum=t.MOMENTUM,
        weight_decay=t.WEIGHT_DECAY,
    )
    logger.info(
        "%s: %d heads (lrs %s) on %d augmented %s images, %d iterations of batch %d",
        data.key,
        len(lrs),
        ", ".join(f"{lr:.3g}" for lr in lrs),
        len(dataset),
        "+".join(splits),
        iters,
        t.BATCH_SIZE,
    )
    os.makedirs(output_dir, exist_ok=True)

    def batches(start: int) -> Iterator:
        return infinite_batches(dataset, t.BATCH_SIZE, cfg.FEATURES.NUM_WORKERS, cfg.SEED, start)

    run_training(
        model,
        optimizer,
        batches,
        iters,
        CosineParamScheduler(1.0, 0.0),
        cfg,
        dict,  # nothing to evaluate while training: val / test are scored by the caller
        checkpoint_model=model.classifier,
        resume=resume,
        output_dir=output_dir,
        eval_period=0,
        log_to=log_to,
    )
    return [h.eval() for h in model.classifier]
