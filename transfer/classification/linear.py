"""Linear classifiers trained on cached frozen features, several learning rates at once.

A plain loop rather than detectron2's trainer: a step is one (B, D) x (D, C) matmul on features
in memory, cheaper than the engine's per-iteration hooks. The lr sweep is one head per lr in the
same loop; each head's loss depends on its own weights only, so with the same batches and
initialisation head h equals a classifier trained alone with ``lrs[h]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from fvcore.common.param_scheduler import CosineParamScheduler, ParamScheduler
from torch import nn

from pretrain.utils.progress import progress

__all__ = [
    "best_index",
    "classification_loss",
    "iterations_for",
    "linear_head",
    "log_spaced",
    "predict",
    "train_linear_heads",
]


def linear_head(
    feature_dim: int, num_classes: int, generator: torch.Generator | None = None
) -> nn.Linear:
    """``nn.Linear(feature_dim, num_classes)`` initialised as MoCo's linear classifier
    (``main_lincls.py``): weights N(0, 0.01) drawn from ``generator``, biases 0."""
    head = nn.Linear(feature_dim, num_classes)
    with torch.no_grad():
        head.weight.normal_(0.0, 0.01, generator=generator)
        head.bias.zero_()
    return head


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against class ids (B,); against multi-label (B, C) labels in {1, 0, -1}
    (VOC2007, :mod:`.voc07`) the mean binary cross-entropy of the known entries: a difficult
    (-1) entry is left out, as the VOC devkit leaves it out of the class's AP."""
    if labels.ndim == 1:
        return F.cross_entropy(logits, labels)
    known = labels >= 0
    target = labels.clamp(min=0).to(logits.dtype)
    loss = F.binary_cross_entropy_with_logits(logits, target, reduction="none")  # (B, C)
    return (loss * known).sum() / known.sum().clamp(min=1)


def log_spaced(low: float, high: float, num: int) -> list[float]:
    """``num`` logarithmically spaced values from ``low`` to ``high`` inclusive."""
    if low <= 0 or high < low or num < 1:
        raise ValueError(f"need 0 < low <= high and num >= 1, got {low}, {high}, {num}")
    if num == 1:
        return [float(low)]
    values = [float(v) for v in np.logspace(math.log10(low), math.log10(high), num)]
    values[0], values[-1] = float(low), float(high)  # exact ends (logspace gives 0.0999...)
    return values


def best_index(scores: Sequence[float]) -> int:
    """Index of the highest score; ties go to the earliest (smallest learning rate)."""
    if not scores:
        raise ValueError("no scores to choose from")
    return max(range(len(scores)), key=lambda i: (scores[i], -i))


def iterations_for(iters: int, epochs: int, num_samples: int, batch_size: int) -> int:
    """A budget given as iterations (``iters``) or epochs over ``num_samples`` (exactly one > 0)."""
    if (iters > 0) == (epochs > 0):
        raise ValueError(f"give exactly one of iters ({iters}) and epochs ({epochs}) > 0")
    if iters > 0:
        return iters
    return epochs * math.ceil(num_samples / batch_size)


def _batches(n: int, batch_size: int, iters: int, gen: torch.Generator):
    """``iters`` index batches drawn without replacement epoch by epoch (no partial batches
    unless n < batch_size)."""
    perm, pos = torch.randperm(n, generator=gen), 0
    for _ in range(iters):
        if pos + min(batch_size, n) > n:
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos : pos + batch_size]
        pos += len(idx)
        yield idx


def train_linear_heads(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    lrs: Sequence[float],
    iters: int,
    batch_size: int = 256,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    schedule: ParamScheduler | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    desc: str = "linear",
    log: Callable[[int, dict[str, float]], None] | None = None,
    log_period: int = 20,
) -> list[nn.Linear]:
    """One ``nn.Linear(D, num_classes)`` per learning rate, trained with SGD on ``features``,
    identically initialised (:func:`linear_head`); ``schedule`` multiplies every base lr
    (default cosine from 1 to 0 over ``iters``). ``log(iteration, scalars)`` receives
    ``total_loss`` (summed over the heads) and ``lr`` (the first head's) every ``log_period``
    iterations and at the last (the loss read from the device only then)."""
    if features.ndim != 2 or features.shape[0] != labels.shape[0]:
        raise ValueError(f"features {tuple(features.shape)} and labels {tuple(labels.shape)}")
    if iters < 1 or batch_size < 1 or not lrs:
        raise ValueError(f"need iters >= 1, batch_size >= 1, lrs; got {iters}, {batch_size}, {lrs}")
    if labels.ndim == 1 and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"labels must lie in [0, {num_classes}), got [{labels.min()}, {labels.max()}]"
        )
    device = torch.device(device)
    schedule = schedule or CosineParamScheduler(1.0, 0.0)
    gen = torch.Generator().manual_seed(seed)
    init = linear_head(features.shape[1], num_classes, gen)
    heads = nn.ModuleList([nn.Linear(features.shape[1], num_classes) for _ in lrs]).to(device)
    for h in heads:
        h.load_state_dict(init.state_dict())
    opt = torch.optim.SGD(
        [{"params": h.parameters(), "lr": lr} for h, lr in zip(heads, lrs, strict=True)],
        lr=float(lrs[0]),
        momentum=momentum,
        weight_decay=weight_decay,
    )
    x_all, y_all = features.to(device), labels.to(device)
    batches = _batches(features.shape[0], batch_size, iters, gen)
    for it, idx in enumerate(progress(batches, total=iters, desc=desc, unit="it")):
        mult = schedule(it / iters)
        for group, lr in zip(opt.param_groups, lrs, strict=True):
            group["lr"] = lr * mult
        idx = idx.to(device)
        x, y = x_all[idx], y_all[idx]  # (B, D), (B,)
        loss = sum(classification_loss(h(x), y) for h in heads)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if log is not None and ((it + 1) % log_period == 0 or it + 1 == iters):
            log(it, {"total_loss": loss.item(), "lr": lrs[0] * mult})
    return [h.eval() for h in heads]


@torch.no_grad()
def predict(head: nn.Module, features: torch.Tensor, batch_size: int = 8192) -> torch.Tensor:
    """Logits (N, C) of ``head`` on ``features`` (on the head's device), returned on CPU."""
    device = next(head.parameters()).device
    out = [
        head(features[i : i + batch_size].to(device)).cpu()
        for i in range(0, len(features), batch_size)
    ]
    return torch.cat(out)
