"""A detectron2 hook that tracks weighted-kNN accuracy of the features during pretraining.

Every ``period`` iterations and once after training (stored at ``max_iter``, as detectron2's
``EvalHook`` does), the hook embeds ``train_loader`` and
``test_loader`` with ``feature_fn`` and puts the weighted kNN top-1 (k = 200, T = 0.07 by
default, see :mod:`.knn`) into the trainer's event storage as ``knn/top1`` (a fraction in
[0, 1]). Register it before ``PeriodicWriter`` so the value is written in the same step.

Contract of ``feature_fn(images) -> (B, D) features``: it receives each batch exactly as the
loaders yield it (on CPU), moves it to its device, and is responsible for eval mode (e.g. the
query backbone with BatchNorm statistics frozen); :func:`.features.module_feature_fn` builds such
a callable and restores the module's training mode afterwards. The hook embeds with
:func:`.features.embed` (under ``torch.no_grad()``) on the main process only (the other processes
wait at a barrier); it is meant for small monitoring sets (ImageNet-100 subsets, Fashion-MNIST),
not full ImageNet.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from detectron2.engine import HookBase
from detectron2.utils import comm

from .features import FeatureFn, embed
from .knn import KNN_K, KNN_T, knn_accuracy

__all__ = ["KNNHook"]

logger = logging.getLogger(__name__)


class KNNHook(HookBase):
    """Weighted kNN top-1 every ``period`` iterations and after training -> ``knn/top1``."""

    def __init__(
        self,
        period: int,
        feature_fn: FeatureFn,
        train_loader: Iterable,
        test_loader: Iterable,
        num_classes: int,
        k: int = KNN_K,
        temperature: float = KNN_T,
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
