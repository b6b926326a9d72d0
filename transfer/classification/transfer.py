"""The 12-dataset linear transfer harness (paper Sec. 5.1, Table 2).

Per dataset: extract frozen features of every source split once (cached on disk, see
:mod:`.features`), train one linear classifier per learning rate of the sweep (7 log-spaced
values in [0.1, 100]) on ``train``, pick the best by the dataset's metric on ``val``, retrain with
that lr on ``train + val`` and report the metric on ``test``. SGD, batch 256, momentum 0.9, no
weight decay, cosine decay, the paper's per-dataset budgets (configurable).

Augmentation: features are those of the evaluation pipeline (resize 256, centre crop 224)
without any training augmentation, as in the linear-transfer protocols of Kornblith et al. and
SimCLR; this is what lets the whole sweep cost one backbone pass per image.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field

import torch
from fvcore.common.config import CfgNode

from .backbone import EvalBackbone
from .datasets import TransformedDataset
from .features import FeatureCache, extract_features
from .linear import best_index, iterations_for, log_spaced, predict, train_linear_heads
from .metrics import score
from .report import pct, plot_transfer_bars, transfer_columns, update_table
from .transfer_datasets import (
    DATASET_NAMES,
    BuildContext,
    TransferData,
    build_transfer_dataset,
    source_digest,
)
from .transforms import eval_transform

__all__ = ["DatasetResult", "dataset_root", "run_transfer", "transfer_dataset", "write_tables"]

logger = logging.getLogger(__name__)


@dataclass
class DatasetResult:
    key: str
    name: str
    metric: str
    val_protocol: str
    num_classes: int
    n_train: int
    n_val: int
    n_test: int
    iters_sweep: int
    iters_final: int
    lrs: list[float] = field(default_factory=list)
    val_scores: list[float] = field(default_factory=list)
    best_lr: float = 0.0
    test_score: float = 0.0


def dataset_root(cfg: CfgNode, key: str) -> str:
    root = cfg.TRANSFER.ROOTS[key.upper()]
    if root:
        return root
    if not cfg.TRANSFER.DATA_ROOT:
        raise ValueError(
            f"no root for {key}: set TRANSFER.DATA_ROOT or TRANSFER.ROOTS.{key.upper()}"
        )
    return os.path.join(cfg.TRANSFER.DATA_ROOT, key)


def _features(data: TransferData, backbone: EvalBackbone, cfg, cache, device):
    transform = eval_transform(cfg.INPUT.RESIZE, cfg.INPUT.CROP)
    out = {}
    for src, ds in data.sources.items():
        parts = {
            "backbone": backbone.identity,
            "dataset": data.key,
            "split": src,
            "transform": repr(transform),
            **source_digest(data, src),
        }

        def compute(ds=ds, src=src):
            return extract_features(
                backbone.model,
                TransformedDataset(ds, transform),
                device,
                cfg.FEATURES.BATCH_SIZE,
                cfg.FEATURES.NUM_WORKERS,
                desc=f"{data.key}/{src} features",
            )

        feats, labels = cache.get_or_compute(parts, compute)
        expected = torch.as_tensor(data.labels[src])
        if not torch.equal(labels, expected):
            raise RuntimeError(f"{data.key}/{src}: labels from the loader differ from the index")
        out[src] = (feats, labels)
    return out


def _gather(feats, parts) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*[(feats[s][0][idx], feats[s][1][idx]) for s, idx in parts], strict=True)
    return torch.cat(xs), torch.cat(ys)


def transfer_dataset(
    data: TransferData, backbone: EvalBackbone, cfg: CfgNode, cache: FeatureCache, device
) -> DatasetResult:
    """Sweep, select on val, retrain on train+val, score test for one dataset."""
    t = cfg.TRANSFER
    feats = _features(data, backbone, cfg, cache, device)
    x_tr, y_tr = _gather(feats, data.splits["train"])
    x_va, y_va = _gather(feats, data.splits["val"])
    x_te, y_te = _gather(feats, data.splits["test"])
    budget = t.BUDGET[data.key.upper()]
    lrs = log_spaced(t.LR_RANGE[0], t.LR_RANGE[1], t.NUM_LRS)
    common = dict(
        batch_size=t.BATCH_SIZE,
        momentum=t.MOMENTUM,
        weight_decay=t.WEIGHT_DECAY,
        seed=cfg.SEED,
        device=device,
    )
    iters = iterations_for(budget.ITERS, budget.EPOCHS, len(y_tr), t.BATCH_SIZE)
    desc = f"{data.key} sweep ({len(lrs)} lrs)"
    heads = train_linear_heads(x_tr, y_tr, data.num_classes, lrs, iters, **common, desc=desc)
    val_scores = [score(data.metric, predict(h, x_va), y_va) for h in heads]
    best_lr = lrs[best_index(val_scores)]
    x_tv, y_tv = torch.cat([x_tr, x_va]), torch.cat([y_tr, y_va])
    iters_final = iterations_for(budget.ITERS, budget.EPOCHS, len(y_tv), t.BATCH_SIZE)
    desc = f"{data.key} final lr={best_lr:.3g}"
    (head,) = train_linear_heads(
        x_tv, y_tv, data.num_classes, [best_lr], iters_final, **common, desc=desc
    )
    test = score(data.metric, predict(head, x_te), y_te)
    val_txt = ", ".join(f"{lr:.3g}: {100 * v:.1f}" for lr, v in zip(lrs, val_scores, strict=True))
    logger.info(
        "%s: val %s by lr {%s} -> lr %.4g; test %.2f%%",
        data.name,
        data.metric,
        val_txt,
        best_lr,
        100 * test,
    )
    return DatasetResult(
        key=data.key,
        name=data.name,
        metric=data.metric,
        val_protocol=data.val_protocol,
        num_classes=data.num_classes,
        n_train=len(y_tr),
        n_val=len(y_va),
        n_test=len(y_te),
        iters_sweep=iters,
        iters_final=iters_final,
        lrs=lrs,
        val_scores=val_scores,
        best_lr=best_lr,
        test_score=test,
    )


def run_transfer(
    cfg: CfgNode, backbone: EvalBackbone, device: torch.device | str = "cpu"
) -> list[DatasetResult]:
    """Run every dataset of ``cfg.TRANSFER.DATASETS``; missing roots fail before any work."""
    cache_dir = cfg.FEATURES.CACHE_DIR or os.path.join(cfg.OUTPUT_DIR, "feature_cache")
    cache = FeatureCache(cache_dir, cfg.FEATURES.DTYPE)
    ctx = BuildContext(cfg.SEED, cfg.TRANSFER.VAL_FRACTION, cache_dir)
    # Build (read the split files of) every dataset first so a bad root fails in seconds.
    datas = [build_transfer_dataset(k, dataset_root(cfg, k), ctx) for k in cfg.TRANSFER.DATASETS]
    backbone.model.to(device)
    return [transfer_dataset(d, backbone, cfg, cache, device) for d in datas]


def write_tables(output_dir: str, model_name: str, results: list[DatasetResult]) -> str:
    """Update ``table2_transfer.{csv,md,png}`` (row ``model_name``) and write the details CSV.

    Returns the Markdown table path.
    """
    names = list(DATASET_NAMES.values())
    row: dict[str, object] = {"Model": model_name}
    row.update({r.name: pct(r.test_score) for r in results})
    csv_path = os.path.join(output_dir, "table2_transfer.csv")
    # Average over the datasets present in the (merged) row; the count says how many.
    rows = update_table(csv_path, transfer_columns(names), row)
    mine = next(r for r in rows if r["Model"] == model_name)
    present = [float(mine[n]) for n in names if mine.get(n)]
    avg = {"Average": f"{sum(present) / len(present):.2f}", "n_datasets": str(len(present))}
    rows = update_table(
        csv_path,
        transfer_columns(names),
        {"Model": model_name, **avg},
        title="Linear classification on other tasks (paper Table 2)",
    )
    plot_transfer_bars(os.path.join(output_dir, "table2_transfer.png"), rows, names)
    details = os.path.join(output_dir, "transfer_details.csv")
    for r in results:
        d = asdict(r)
        d["lrs"] = " ".join(f"{x:.4g}" for x in r.lrs)
        d["val_scores"] = " ".join(pct(x) for x in r.val_scores)
        d["test_score"] = pct(r.test_score)
        update_table(details, ["run", *d], {"run": f"{model_name}/{r.key}", **d})
    return os.path.splitext(csv_path)[0] + ".md"
