"""``TRANSFER.PROTOCOL finetune``: the whole network fine-tuned per dataset (SimCLR Appendix B.8,
after Kornblith et al. 2019; the recipe and its source are quoted in docs/evaluation.md).

Per dataset: one run per (lr, weight decay) point of :func:`search_grid` on ``train``, scored on
``val`` by the dataset's metric; the best point (:func:`select_point`) is retrained on
``train + val`` and scored on ``test``. Every run is semi-supervised fine-tuning's model
(:class:`.probe.Classifier`: backbone + linear layer, all trained) on the classification
engine (:func:`.engine.run_training`), with RandomResizedCrop + flip images; val and test are
scored on centre crops. Each point leaves ``point.json`` (its score) in
``<output>/finetune/<key>/<point>/``: a resumed run (``--resume``) skips finished points and
continues an unfinished one from its last checkpoint; checkpoints of a finished point are
deleted (57 ResNet-50s per dataset would fill a disk).
"""

from __future__ import annotations

import copy
import datetime
import glob
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from detectron2.utils import comm
from fvcore.common.config import CfgNode
from fvcore.common.param_scheduler import ConstantParamScheduler, CosineParamScheduler
from torch import nn

from .augmented import centre_crop_features, split_images
from .backbone import EvalBackbone
from .engine import infinite_batches, iters_per_epoch, run_stage, run_training, wrap_ddp
from .linear import best_index, linear_head, log_spaced
from .metrics import score
from .probe import Classifier
from .transfer_datasets import TransferData
from .transforms import train_transform

__all__ = [
    "FineTuning",
    "SearchPoint",
    "bn_momentum",
    "finetune_search",
    "search_grid",
    "select_point",
]

logger = logging.getLogger(__name__)

POINT_FILE = "point.json"
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


@dataclass(frozen=True)
class SearchPoint:
    """One point of the search: SGD's learning rate and weight decay (as given to SGD)."""

    lr: float
    wd: float

    @property
    def tag(self) -> str:
        return f"lr{self.lr:.4g}_wd{self.wd:.4g}"


def search_grid(cfg: CfgNode) -> list[SearchPoint]:
    """``FINETUNE.NUM_LRS`` log-spaced lrs in ``LR_RANGE`` x (0 if ``ZERO_WD``, then ``NUM_WDS``
    log-spaced values in ``WD_RANGE``), each wd divided by the lr when ``WD_OVER_LR``; in grid
    order (lr ascending, then wd ascending), which breaks ties (:func:`select_point`)."""
    f = cfg.FINETUNE
    lrs = log_spaced(f.LR_RANGE[0], f.LR_RANGE[1], f.NUM_LRS)
    wds = [0.0] if f.ZERO_WD else []
    wds += log_spaced(f.WD_RANGE[0], f.WD_RANGE[1], f.NUM_WDS) if f.NUM_WDS else []
    return [SearchPoint(lr, wd / lr if f.WD_OVER_LR else wd) for lr in lrs for wd in wds]


def select_point(scores: Sequence[float]) -> int:
    """Index of the best validation score; ties go to the earliest point of the grid (the
    smaller lr, then the smaller weight decay), as the linear sweep's ties go to the smaller lr."""
    return best_index(scores)


def bn_momentum(steps_per_epoch: int) -> float:
    """PyTorch's BatchNorm momentum for SimCLR's "max(1 - 10/s, 0.9)" (TensorFlow's decay, s
    steps per epoch): ``1 - decay`` = min(10 / s, 0.1)."""
    return 1.0 - max(1.0 - 10.0 / max(steps_per_epoch, 1), 0.9)


def finetune_search(
    points: Sequence[SearchPoint], evaluate: Callable[[SearchPoint], float]
) -> tuple[list[float], int]:
    """Every point's validation score by ``evaluate`` and the index of the chosen one; each
    point is logged with the search's ETA (the mean time of the points so far)."""
    scores: list[float] = []
    start = time.perf_counter()
    for i, p in enumerate(points):
        eta = ""
        if i:
            left = (time.perf_counter() - start) / i * (len(points) - i)
            eta = f", search ETA {datetime.timedelta(seconds=round(left))}"
        logger.info(
            "search point %d/%d: lr %.4g, weight decay %.4g%s", i + 1, len(points), p.lr, p.wd, eta
        )
        scores.append(float(evaluate(p)))
    return scores, select_point(scores)


@dataclass(frozen=True)
class FineTuning:
    """One dataset's fine-tuning runs, each a fresh copy of ``backbone`` plus a linear layer
    trained with ``cfg.FINETUNE`` on ``device``; with ``resume``, a run interrupted before
    continues from its last checkpoint."""

    data: TransferData
    backbone: EvalBackbone
    cfg: CfgNode
    device: torch.device | str
    resume: bool = False

    def fine_tune(self, splits: Sequence[str], point: SearchPoint, output_dir: str) -> Classifier:
        """The network trained ``FINETUNE.ITERS`` steps on augmented images of ``splits`` at
        ``point``, its checkpoints in ``output_dir``."""
        data, cfg, f = self.data, self.cfg, self.cfg.FINETUNE
        dataset, _ = split_images(data, splits, train_transform(cfg.INPUT.CROP))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.SEED)  # the same classifier initialisation at every point
            head = linear_head(
                self.backbone.feature_dim, data.num_classes, torch.Generator().manual_seed(cfg.SEED)
            )
            model = Classifier(copy.deepcopy(self.backbone.model), head, self.device)
        if f.BN_MOMENTUM_PER_EPOCH:
            momentum = bn_momentum(iters_per_epoch(len(dataset), f.BATCH_SIZE))
            for m in model.modules():
                if isinstance(m, _BATCH_NORMS):
                    m.momentum = momentum
        optimizer = torch.optim.SGD(
            model.parameters(),
            lr=point.lr,
            momentum=f.MOMENTUM,
            nesterov=f.NESTEROV and f.MOMENTUM > 0,
            weight_decay=point.wd,
        )
        schedule = (
            CosineParamScheduler(1.0, 0.0)
            if f.SCHEDULE == "cosine"
            else ConstantParamScheduler(1.0)
        )
        os.makedirs(output_dir, exist_ok=True)

        def batches(start: int) -> Iterator:  # iteration t's batch depends on (SEED, t) only
            return infinite_batches(
                dataset, f.BATCH_SIZE, cfg.FEATURES.NUM_WORKERS, cfg.SEED, start
            )

        run_training(
            wrap_ddp(model, model.device),
            optimizer,
            batches,
            f.ITERS,
            schedule,
            cfg,
            dict,  # scored by the caller on val / test centre crops
            checkpoint_model=model,
            resume=self.resume,
            output_dir=output_dir,
            eval_period=0,
            checkpoint_period=f.CHECKPOINT_PERIOD,
        )
        return model

    def point_score(
        self, splits: Sequence[str], split: str, point: SearchPoint, output_dir: str
    ) -> float:
        """``split``'s score after fine-tuning on ``splits`` at ``point``: a stage of the search
        (:func:`.engine.run_stage`, recorded in ``output_dir/point.json``), read back when that
        point finished before, else trained (continued from its last checkpoint with
        ``resume``), scored and recorded; the point's checkpoints are then deleted."""

        data, cfg = self.data, self.cfg

        def work() -> dict:
            model = self.fine_tune(splits, point, output_dir)
            net = nn.Sequential(model.backbone, nn.Flatten(1), model.head)  # images -> logits
            value = score(data.metric, *centre_crop_features(data, split, net, cfg, self.device))
            entry = {"lr": point.lr, "wd": point.wd, "trained_on": list(splits), "scored_on": split}
            return entry | {"metric": data.metric, "score": value, "iters": cfg.FINETUNE.ITERS}

        done = run_stage(output_dir, work, results=POINT_FILE)
        if comm.is_main_process():
            _drop_checkpoints(output_dir)
        return float(done["score"])


def _drop_checkpoints(output_dir: str) -> None:
    tag = os.path.join(output_dir, "last_checkpoint")
    for path in [*glob.glob(os.path.join(output_dir, "model_*.pth")), tag]:
        if os.path.isfile(path):
            os.remove(path)
