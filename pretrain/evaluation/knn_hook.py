"""A detectron2 hook that tracks weighted-kNN accuracy of the features during pretraining.

Every ``period`` iterations and once after training (stored at ``max_iter``, as detectron2's
``EvalHook`` does), the hook embeds ``train_loader`` and
``test_loader`` with ``feature_fn`` and puts the weighted kNN top-1 (k = 200, T = 0.07 by
default, see :mod:`.knn`) into the trainer's event storage as ``knn/top1`` (a fraction in
[0, 1]). Register it before ``PeriodicWriter`` so the value is written in the same step.

Contract of ``feature_fn(images) -> (B, D) features``: it receives each batch exactly as the
loaders yield it (on CPU), moves it to its device, and is responsible for eval mode (e.g. the
query backbone with BatchNorm statistics frozen); :func:`module_feature_fn` builds such a callable
and restores the module's training mode afterwards. The hook runs it under ``torch.no_grad()``
on the main process only (the other processes wait at a barrier); it is meant for small
monitoring sets (ImageNet-100 subsets, Fashion-MNIST), not full ImageNet.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch
from detectron2.engine import HookBase
from detectron2.utils import comm
from torch import nn

from .knn import knn_accuracy

__all__ = ["KNNHook", "embed", "module_feature_fn"]

logger = logging.getLogger(__name__)

FeatureFn = Callable[[torch.Tensor], torch.Tensor]


@torch.no_grad()
def embed(feature_fn: FeatureFn, loader: Iterable) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (N, D) float32 CPU, labels (N,))`` of every ``(images, labels)`` batch."""
    feats, labels = [], []
    for images, targets in loader:
        feats.append(feature_fn(images).flatten(1).float().cpu())
        labels.append(torch.as_tensor(targets, dtype=torch.int64))
    if not feats:
        raise ValueError("kNN: a loader yielded no batches")
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


class KNNHook(HookBase):
    """Weighted kNN top-1 every ``period`` iterations and after training -> ``knn/top1``."""

    def __init__(
        self,
        period: int,
        feature_fn: FeatureFn,
        train_loader: Iterable,
        test_loader: Iterable,
        num_classes: int,
        k: int = 200,
        temperature: float = 0.07,
    ) -> None:
        if period < 1:
            raise ValueError(f"KNNHook period must be >= 1, got {period}")
        if num_classes < 2:
            raise ValueError(f"KNNHook num_classes must be >= 2, got {num_classes}")
        self._period = period
        self._feature_fn = feature_fn
        self._train_loader = train_loader
        self._test_loader = test_loader
        self._num_classes = num_classes
        self._k = k
        self._temperature = temperature
        self.last_top1: float | None = None

    def compute(self) -> float:
        """kNN top-1 of the current features (also usable outside a trainer)."""
        train_x, train_y = embed(self._feature_fn, self._train_loader)
        test_x, test_y = embed(self._feature_fn, self._test_loader)
        return knn_accuracy(
            train_x, train_y, test_x, test_y, self._num_classes, self._k, self._temperature
        )

    def _run(self) -> None:
        if comm.is_main_process():
            self.last_top1 = self.compute()
            self.trainer.storage.put_scalar("knn/top1", self.last_top1, smoothing_hint=False)
            logger.info(
                "iter %d: kNN top-1 %.2f%%", self.trainer.storage.iter, 100 * self.last_top1
            )
        comm.synchronize()

    def after_step(self) -> None:
        next_iter = self.trainer.iter + 1
        if next_iter % self._period == 0 and next_iter != self.trainer.max_iter:
            self._run()  # the last iteration is handled in after_train

    def after_train(self) -> None:
        # trainer.iter == max_iter only when training finished (not after an exception)
        if self.trainer.iter + 1 >= self.trainer.max_iter:
            self._run()
