"""Semi-supervised evaluation: fine-tune the whole network on 1% / 10% of ImageNet labels.

The paper's recipe (after SwAV; values in ``configs/eval/semi_*.yaml``) sweeps "base learning
rates of the linear layer" in [0.01, 10]: the sweep value is the classifier's lr and the backbone
gets value / ``HEAD_LR_MULT`` (SwAV's 1% recipe, backbone 0.02 and head 5, is such a point). The
lr is selected on seeded training images outside the label split, never on the reported val set.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import yaml
from detectron2.utils import comm
from fvcore.common.config import CfgNode
from torch.utils.data import Dataset

from pretrain.data.datasets import IMAGEFOLDER, TransformedDataset
from pretrain.data.splits import per_class_split
from pretrain.engine.writers import write_scalars
from pretrain.utils.errors import DatasetError

from .backbone import EvalBackbone
from .datasets import labelled_sets, read_subset_file, subset_indices
from .engine import evaluate_topk, run_stage, supervised_sets, train_supervised, wrap_ddp
from .linear import best_index, linear_head, log_spaced
from .probe import Classifier

__all__ = ["SemiResult", "heldout_indices", "run_semi_supervised"]

logger = logging.getLogger(__name__)


def heldout_indices(targets: list[int], exclude: set[int], per_class: int, seed: int) -> list[int]:
    """Up to ``per_class`` seeded indices per class among those not in ``exclude``."""
    held, _ = per_class_split(targets, [per_class], seed, exclude)
    return held.tolist()


@dataclass
class SemiResult:
    percent: int
    lrs: list[float]
    heldout_top1: list[float]
    val: list[dict[str, float]]
    best_lr: float
    top1: float
    top5: float
    num_labelled: int
    max_iter: int


@dataclass
class SemiData:
    """The labelled split, ImageNet val and the held-out images that select the lr."""

    train: Dataset
    val: Dataset
    heldout: Dataset
    num_classes: int
    max_iter: int


def semi_data(cfg: CfgNode, data_root: str) -> SemiData:
    """The labelled, val and held-out sets of a semi-supervised run (every file read now)."""
    if not cfg.DATA.SPLIT_FILE:
        raise DatasetError("DATA.SPLIT_FILE is empty: give the 1% or 10% label-split file")
    names = read_subset_file(cfg.DATA.SPLIT_FILE)
    train_all, val_base, num_classes = labelled_sets(IMAGEFOLDER, data_root, cfg.DATA.CLASS_LIST)
    labelled = subset_indices(train_all, names, cfg.DATA.SPLIT_FILE)
    held = heldout_indices(train_all.targets, set(labelled), cfg.DATA.HELDOUT_PER_CLASS, cfg.SEED)
    if not held:
        raise DatasetError(f"{data_root}/train: no unlabelled images left to select the lr on")
    train_set, val_set, max_iter = supervised_sets(cfg, train_all, val_base, labelled)
    held_set = TransformedDataset(train_all, val_set.transform, held)
    return SemiData(train_set, val_set, held_set, num_classes, max_iter)


def _fine_tune(
    cfg: CfgNode,
    backbone: EvalBackbone,
    data: SemiData,
    lr: float,
    device: torch.device | str,
    out_dir: str,
    resume: bool,
    log_to: Sequence[str],
) -> dict[str, float]:
    """Fine-tune a fresh copy of the backbone with classifier lr ``lr`` (the backbone's is
    ``lr / HEAD_LR_MULT``) in ``out_dir`` (``resume``: from its last checkpoint); its held-out
    top-1 and val top-1 / top-5 at the end."""
    s = cfg.SOLVER
    # A fresh copy per lr: every run starts from the pretrained weights, sharing no parameter
    # with a previous run's DDP wrapper.
    net = copy.deepcopy(backbone.model)
    # the head drawn from SEED: every lr's starts the same, whichever ran before it
    head = linear_head(
        backbone.feature_dim, data.num_classes, torch.Generator().manual_seed(cfg.SEED)
    )
    model = Classifier(net, head, device)
    optimizer = torch.optim.SGD(
        [
            {"params": model.backbone.parameters(), "lr": lr / s.HEAD_LR_MULT},
            {"params": model.head.parameters(), "lr": lr},
        ],
        lr=lr,
        momentum=s.MOMENTUM,
        weight_decay=s.WEIGHT_DECAY,
    )

    def eval_fn() -> dict[str, float]:
        model.eval()
        try:
            kw = dict(batch_size=cfg.TEST.BATCH_SIZE, num_workers=cfg.DATA.NUM_WORKERS)
            h = evaluate_topk(model.logits, data.heldout, model.device, desc="held-out", **kw)
            v = evaluate_topk(model.logits, data.val, model.device, desc="val", **kw)
        finally:
            model.train()
        return {"heldout_top1": h["top1"], "top1": v["top1"], "top5": v["top5"]}

    os.makedirs(out_dir, exist_ok=True)
    return train_supervised(
        wrap_ddp(model, model.device),
        optimizer,
        data.train,
        data.max_iter,
        cfg,
        eval_fn,
        checkpoint_model=model,  # the whole network: a Ctrl-C saves it, --resume continues it
        resume=resume,
        output_dir=out_dir,
        log_to=log_to,
    )


def run_semi_supervised(
    cfg: CfgNode,
    backbone: EvalBackbone,
    data_root: str,
    device: torch.device | str,
    data: SemiData | None = None,
    resume: bool = False,
    log_to: Sequence[str] = (),
) -> SemiResult:
    """Fine-tune once per classifier lr (in ``OUTPUT_DIR/lr_<lr>``), select the lr on the
    held-out images and report its ImageNet val top-1 / top-5. ``resume``: the lrs finished
    before are read back, the one interrupted continues from its last checkpoint, exactly."""
    data = data or semi_data(cfg, data_root)
    s = cfg.SOLVER
    lrs = list(s.LRS) or log_spaced(s.LR_RANGE[0], s.LR_RANGE[1], s.NUM_LRS)
    logger.info(
        "semi-supervised %d%%: %d labelled images, %d classes, %d held out for selection, "
        "%d iterations per lr, classifier lrs %s",
        cfg.DATA.LABEL_PERCENT,
        len(data.train),
        data.num_classes,
        len(data.heldout),
        data.max_iter,
        lrs,
    )
    heldout, vals = [], []
    for lr in lrs:
        out_dir = os.path.join(cfg.OUTPUT_DIR, f"lr_{lr:.4g}")
        res = run_stage(
            out_dir,
            lambda: _fine_tune(cfg, backbone, data, lr, device, out_dir, resume, log_to),  # noqa: B023
        )
        heldout.append(res["heldout_top1"])
        vals.append({"top1": res["top1"], "top5": res["top5"]})
        logger.info(
            "lr %.4g: held-out top-1 %.2f%%, val top-1 %.2f%% top-5 %.2f%%",
            lr,
            100 * res["heldout_top1"],
            100 * res["top1"],
            100 * res["top5"],
        )
    best = best_index(heldout)
    if comm.is_main_process():  # the selected lr's figures, as each lr_*/ logs its own
        scalars = {"eval/top1": vals[best]["top1"], "eval/top5": vals[best]["top5"]}
        scalars["eval/heldout_top1"] = heldout[best]
        write_scalars(cfg.OUTPUT_DIR, scalars, log_to=log_to, config=yaml.safe_load(cfg.dump()))
    return SemiResult(
        cfg.DATA.LABEL_PERCENT,
        lrs,
        heldout,
        vals,
        lrs[best],
        vals[best]["top1"],
        vals[best]["top5"],
        len(data.train),
        data.max_iter,
    )
