"""Linear classification on frozen features (paper Table 1; ImageNet-100 ablations): a frozen
backbone (eval mode) and one linear layer trained with SGD on RandomResizedCrop + flip images,
top-1 / top-5 on centre crops; recipes in ``configs/eval/``. Only the linear layer is in DDP.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from fvcore.common.config import CfgNode
from torch import nn
from torch.utils.data import Dataset

from pretrain.data.datasets import dataset_type

from .backbone import EvalBackbone
from .datasets import labelled_sets
from .engine import evaluate_topk, supervised_sets, train_supervised, wrap_ddp
from .linear import classification_loss, linear_head

__all__ = [
    "Classifier",
    "LinearProbe",
    "ProbeResult",
    "build_classification_sets",
    "run_linear_probe",
]

logger = logging.getLogger(__name__)


def build_classification_sets(cfg: CfgNode, data_root: str) -> tuple[Dataset, Dataset, int]:
    """``(train, val, num_classes)`` of PIL images: ``<root>/{train,val}`` or Fashion-MNIST."""
    kind = dataset_type(cfg.DATA.NAME)
    return labelled_sets(kind, data_root, cfg.DATA.CLASS_LIST, image_size=cfg.DATA.IMAGE_SIZE)


class Classifier(nn.Module):
    """A backbone and a head on ``device``, the model of every protocol that trains on images:
    whole in fine-tuning (:mod:`.semi`, :mod:`.finetune`), the head alone in :class:`LinearProbe`;
    ``forward((images, labels))`` returns the loss dict (:func:`.linear.classification_loss`)."""

    def __init__(self, backbone: nn.Module, head: nn.Module, device: torch.device | str) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.backbone, self.head = backbone.to(self.device), head.to(self.device)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images.to(self.device, non_blocking=True)).flatten(1)

    def logits(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        images, labels = batch
        logits = self.head(self.features(images))  # through DDP where the head is wrapped
        return {"loss_cls": classification_loss(logits, labels.to(self.device))}


class LinearProbe(Classifier):
    """A frozen backbone in eval mode (BatchNorm keeps its pretrained statistics) and a trained
    ``head`` (:func:`.linear.linear_head`, or :mod:`.augmented`'s heads), alone in DDP."""

    def __init__(self, backbone: nn.Module, head: nn.Module, device: torch.device | str) -> None:
        super().__init__(backbone.requires_grad_(False), head, device)
        self.classifier = head  # the layer itself; ``head`` is it in DDP
        self.head = wrap_ddp(head, self.device)

    def train(self, mode: bool = True) -> LinearProbe:
        super().train(mode)
        self.backbone.eval()
        return self

    def features(self, images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return super().features(images)

    def logits(self, images: torch.Tensor) -> torch.Tensor:  # scoring: outside DDP
        return self.classifier(self.features(images))


@dataclass
class ProbeResult:
    top1: float
    top5: float
    max_iter: int
    num_classes: int
    num_train: int
    num_val: int


def run_linear_probe(
    cfg: CfgNode,
    backbone: EvalBackbone,
    data_root: str,
    device: torch.device | str,
    resume: bool = False,
    sets: tuple[Dataset, Dataset, int] | None = None,
    log_to: Sequence[str] = (),
) -> ProbeResult:
    """Train and evaluate the probe; ``sets``: :func:`build_classification_sets` already read;
    ``resume``: continue ``OUTPUT_DIR``'s last checkpoint, exactly (:func:`.engine.run_training`);
    ``log_to``: the optional writers (:func:`pretrain.engine.writers.build_writers`)."""
    train_base, val_base, num_classes = sets or build_classification_sets(cfg, data_root)
    train_set, val_set, max_iter = supervised_sets(cfg, train_base, val_base)
    s = cfg.SOLVER
    # the head drawn from SEED, not from whatever the global generator holds
    head = linear_head(backbone.feature_dim, num_classes, torch.Generator().manual_seed(cfg.SEED))
    model = LinearProbe(backbone.model, head, device)
    optimizer = torch.optim.SGD(
        model.classifier.parameters(),
        lr=s.BASE_LR,
        momentum=s.MOMENTUM,
        weight_decay=s.WEIGHT_DECAY,
    )
    logger.info(
        "linear probe: %d train / %d val images, %d classes, %d iterations of batch %d, lr %g (%s)",
        len(train_set),
        len(val_set),
        num_classes,
        max_iter,
        s.BATCH_SIZE,
        s.BASE_LR,
        s.SCHEDULE,
    )

    def eval_fn() -> dict[str, float]:
        model.eval()
        try:
            return evaluate_topk(
                model.logits,
                val_set,
                model.device,
                cfg.TEST.BATCH_SIZE,
                cfg.DATA.NUM_WORKERS,
                desc="linear probe eval",
            )
        finally:
            model.train()

    res = train_supervised(
        model,
        optimizer,
        train_set,
        max_iter,
        cfg,
        eval_fn,
        checkpoint_model=model.classifier,
        resume=resume,
        log_to=log_to,
    )
    return ProbeResult(
        res["top1"], res["top5"], max_iter, num_classes, len(train_set), len(val_set)
    )
