"""The 12-dataset linear transfer harness (paper Sec. 6.1, Table 2).

Per dataset: one linear classifier per lr of the sweep (7 log-spaced values in [0.1, 100]) on
``train``, the best by the dataset's metric on ``val`` retrained on ``train + val`` and scored on
``test``; SGD, batch 256, momentum 0.9, cosine, the paper's per-dataset budgets.
``TRANSFER.PROTOCOL``: ``cached_features`` (default) trains on centre-crop features computed once
and cached (:mod:`.features`), as Kornblith et al. and SimCLR; ``augmented`` (the paper's wording,
:mod:`.augmented`) on RandomResizedCrop + flip images through the frozen backbone at every step.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import yaml
from detectron2.utils import comm
from fvcore.common.config import CfgNode
from torch import nn

from pretrain.engine.writers import write_scalars
from transfer.tables import CLASH_HINT, RowOwner, check_row, data_source, update_table

from .augmented import centre_crop_features, train_heads_augmented
from .backbone import EvalBackbone
from .config import TRANSFER_PROTOCOLS
from .engine import run_stage, step_log
from .features import FeatureCache, cached_features, labels_digest
from .linear import best_index, iterations_for, log_spaced, predict, train_linear_heads
from .metrics import score
from .report import pct, plot_transfer_bars, transfer_columns
from .transfer_datasets import (
    DATASET_NAMES,
    BuildContext,
    TransferData,
    build_transfer_dataset,
)
from .transforms import eval_transform

__all__ = [
    "DatasetResult",
    "build_transfer_datasets",
    "check_tables",
    "dataset_root",
    "run_transfer",
    "stage_dir",
    "table_row_name",
    "table_sources",
    "transfer_dataset",
    "write_tables",
]

logger = logging.getLogger(__name__)


@dataclass
class DatasetResult:
    key: str
    name: str
    metric: str
    val_protocol: str
    protocol: str  # TRANSFER.PROTOCOL: "cached_features" or "augmented"
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


def _features(
    data: TransferData,
    backbone: EvalBackbone,
    cfg: CfgNode,
    cache: FeatureCache,
    device: torch.device | str,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    transform = eval_transform(cfg.INPUT.RESIZE, cfg.INPUT.CROP)
    args = (device, cfg.FEATURES.BATCH_SIZE, cfg.FEATURES.NUM_WORKERS)
    out = {}
    for src, ds in data.sources.items():
        # the source's identity: its size and labels, not its image bytes
        parts = {"dataset": data.key, "split": src, "root": os.path.abspath(data.root)}
        parts.update(num=len(data.labels[src]), labels=labels_digest(data.labels[src]))
        feats, labels = cached_features(cache, backbone, ds, transform, parts, *args)
        expected = torch.as_tensor(data.labels[src])
        if not torch.equal(labels, expected):
            raise RuntimeError(f"{data.key}/{src}: labels from the loader differ from the index")
        out[src] = (feats, labels)
    return out


def _gather(
    feats: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    parts: Sequence[tuple[str, np.ndarray]],
) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*[(feats[s][0][idx], feats[s][1][idx]) for s, idx in parts], strict=True)
    return torch.cat(xs), torch.cat(ys)


# train(splits, lrs, iters, desc) -> one head per lr; evaluate(split) -> (features, labels)
TrainFn = Callable[[Sequence[str], Sequence[float], int, str], list[nn.Linear]]
EvalFn = Callable[[str], tuple[torch.Tensor, torch.Tensor]]


def stage_dir(cfg: CfgNode, key: str, splits: Sequence[str]) -> str:
    """Where a search point (the sweep on ``train``, the final fit on ``train+val``) of dataset
    ``key`` keeps its results (:func:`.engine.run_stage`) and, augmented, its checkpoints."""
    return os.path.join(cfg.OUTPUT_DIR, cfg.TRANSFER.PROTOCOL, key, "+".join(splits))


def _protocol(
    data: TransferData,
    backbone: EvalBackbone,
    cfg: CfgNode,
    cache: FeatureCache | None,
    device: torch.device | str,
    resume: bool = False,
    log_to: Sequence[str] = (),
) -> tuple[TrainFn, EvalFn]:
    """How classifiers are trained and which features they are scored on, per protocol."""
    t = cfg.TRANSFER
    if t.PROTOCOL == "augmented":

        def train_augmented(
            splits: Sequence[str], lrs: Sequence[float], iters: int, desc: str
        ) -> list[nn.Linear]:
            out = stage_dir(cfg, data.key, splits)
            logger.info("%s (augmented images)", desc)
            return train_heads_augmented(
                data, splits, backbone, cfg, lrs, iters, device, out, resume, log_to
            )

        def centre_crops(split: str) -> tuple[torch.Tensor, torch.Tensor]:
            return centre_crop_features(data, split, backbone, cfg, device)

        return train_augmented, centre_crops
    if t.PROTOCOL != "cached_features":
        raise ValueError(
            f"TRANSFER.PROTOCOL = {t.PROTOCOL!r}: choose from {list(TRANSFER_PROTOCOLS)}"
        )
    if cache is None:
        raise ValueError("the cached_features protocol needs a FeatureCache")
    feats = _features(data, backbone, cfg, cache, device)
    common = dict(
        batch_size=t.BATCH_SIZE,
        momentum=t.MOMENTUM,
        weight_decay=t.WEIGHT_DECAY,
        seed=cfg.SEED,
        device=device,
    )

    def train_cached(
        splits: Sequence[str], lrs: Sequence[float], iters: int, desc: str
    ) -> list[nn.Linear]:
        x, y = _gather(feats, [part for split in splits for part in data.splits[split]])
        with step_log(stage_dir(cfg, data.key, splits), iters, log_to, cfg) as log:
            return train_linear_heads(
                x, y, data.num_classes, lrs, iters, **common, desc=desc, log=log,
                log_period=cfg.LOG_PERIOD,
            )  # fmt: skip

    def cached(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        return _gather(feats, data.splits[split])

    return train_cached, cached


def transfer_dataset(
    data: TransferData,
    backbone: EvalBackbone,
    cfg: CfgNode,
    cache: FeatureCache | None,
    device: torch.device | str,
    resume: bool = False,
    log_to: Sequence[str] = (),
) -> DatasetResult:
    """Sweep, select on val, retrain on train+val, score test for one dataset (``cache``: the
    ``cached_features`` protocol's, ``None`` for ``augmented``). Each search point is a stage
    (:func:`.engine.run_stage`): one finished before is read back, the one interrupted runs
    again (cached features: from its start, deterministic) or continues (augmented: from its
    last checkpoint with ``resume``)."""
    t = cfg.TRANSFER
    train, evaluate = _protocol(data, backbone, cfg, cache, device, resume, log_to)
    n_train, n_val = data.split_size("train"), data.split_size("val")
    budget = t.BUDGET[data.key.upper()]
    lrs = log_spaced(t.LR_RANGE[0], t.LR_RANGE[1], t.NUM_LRS)
    iters = iterations_for(budget.ITERS, budget.EPOCHS, n_train, t.BATCH_SIZE)

    def sweep() -> dict[str, list[float]]:
        heads = train(["train"], lrs, iters, f"{data.key} sweep ({len(lrs)} lrs)")
        x_va, y_va = evaluate("val")
        return {"val_scores": [score(data.metric, predict(h, x_va), y_va) for h in heads]}

    val_scores = run_stage(stage_dir(cfg, data.key, ["train"]), sweep)["val_scores"]
    best_lr = lrs[best_index(val_scores)]
    iters_final = iterations_for(budget.ITERS, budget.EPOCHS, n_train + n_val, t.BATCH_SIZE)

    def final() -> dict[str, float]:
        desc = f"{data.key} final lr={best_lr:.3g}"
        (head,) = train(["train", "val"], [best_lr], iters_final, desc)
        x_te, y_te = evaluate("test")
        return {"test_score": score(data.metric, predict(head, x_te), y_te), "n_test": len(y_te)}

    tested = run_stage(stage_dir(cfg, data.key, ["train", "val"]), final)
    test = tested["test_score"]
    val_txt = ", ".join(f"{lr:.3g}: {100 * v:.1f}" for lr, v in zip(lrs, val_scores, strict=True))
    logger.info(
        "%s (%s): val %s by lr {%s} -> lr %.4g; test %.2f%%",
        data.name,
        t.PROTOCOL,
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
        protocol=t.PROTOCOL,
        num_classes=data.num_classes,
        n_train=n_train,
        n_val=n_val,
        n_test=tested["n_test"],
        iters_sweep=iters,
        iters_final=iters_final,
        lrs=lrs,
        val_scores=val_scores,
        best_lr=best_lr,
        test_score=test,
    )


def _cache_dir(cfg: CfgNode) -> str:
    return cfg.FEATURES.CACHE_DIR or os.path.join(cfg.OUTPUT_DIR, "feature_cache")


def build_transfer_datasets(cfg: CfgNode) -> list[TransferData]:
    """Every dataset of ``cfg.TRANSFER.DATASETS``, its split files read: a bad root fails in
    seconds, before any work (the tool calls it before writing its run directory)."""
    ctx = BuildContext(cfg.SEED, cfg.TRANSFER.VAL_FRACTION, _cache_dir(cfg))
    return [build_transfer_dataset(k, dataset_root(cfg, k), ctx) for k in cfg.TRANSFER.DATASETS]


def run_transfer(
    cfg: CfgNode,
    backbone: EvalBackbone,
    device: torch.device | str = "cpu",
    datas: list[TransferData] | None = None,
    resume: bool = False,
    log_to: Sequence[str] = (),
) -> list[DatasetResult]:
    """Run every dataset of ``cfg.TRANSFER.DATASETS`` (``datas``: already built by
    :func:`build_transfer_datasets`); missing roots fail before any work. ``resume``: continue
    an interrupted run (:func:`transfer_dataset`); ``log_to``: the optional writers."""
    cache = None
    if cfg.TRANSFER.PROTOCOL == "cached_features":
        cache = FeatureCache(_cache_dir(cfg), cfg.FEATURES.DTYPE)
    datas = datas if datas is not None else build_transfer_datasets(cfg)
    backbone.model.to(device)
    results = [transfer_dataset(d, backbone, cfg, cache, device, resume, log_to) for d in datas]
    if comm.is_main_process():
        scalars = {f"eval/{r.key}/test": r.test_score for r in results}
        scalars |= {f"eval/{r.key}/val": max(r.val_scores) for r in results}
        write_scalars(cfg.OUTPUT_DIR, scalars, log_to=log_to, config=yaml.safe_load(cfg.dump()))
    return results


TABLE2 = "table2_transfer.csv"  # in the table dir, with its Markdown twin and bar chart


def table_row_name(model_name: str, protocol: str) -> str:
    """The Table 2 row of a model: its name for the default protocol, ``name (protocol)``
    otherwise, so both protocols of one model sit side by side."""
    return model_name if protocol == "cached_features" else f"{model_name} ({protocol})"


def table_sources(cfg: CfgNode) -> dict[str, str]:
    """Table 2's figures of ``cfg``'s datasets and the data each is computed on (its root):
    the keys of the row's cells (:func:`transfer.tables.update_table`)."""
    return {DATASET_NAMES[k]: data_source(k, dataset_root(cfg, k)) for k in cfg.TRANSFER.DATASETS}


def _owner(model: str | RowOwner) -> RowOwner:
    return model if isinstance(model, RowOwner) else RowOwner(model)


def check_tables(
    output_dir: str,
    model: str | RowOwner,
    protocol: str,
    *,
    replace: bool = False,
    hint: str = CLASH_HINT,
    sources: Mapping[str, str] | None = None,
) -> None:
    """Raise :class:`~transfer.tables.RowClashError` before any work if :func:`write_tables`
    would refuse ``model``'s Table 2 row for ``protocol``."""
    owner = _owner(model)
    row = owner.cells("Model", table_row_name(owner.name, protocol))
    path = os.path.join(output_dir, TABLE2)
    check_row(path, "Model", row, replace=replace, hint=hint, sources=sources)


def write_tables(
    output_dir: str,
    model: str | RowOwner,
    results: list[DatasetResult],
    *,
    replace: bool = False,
    hint: str = CLASH_HINT,
    sources: Mapping[str, str] | None = None,
) -> str:
    """Update ``table2_transfer.{csv,md,png}`` (row :func:`table_row_name`) and the details
    CSV (``replace``, ``hint``, ``sources``: :func:`~transfer.tables.update_table`'s); returns
    the Markdown table's path."""
    protocols = sorted({r.protocol for r in results})
    if len(protocols) != 1:
        raise ValueError(f"results must come from one protocol, got {protocols}")
    owner = _owner(model)
    name = table_row_name(owner.name, protocols[0])
    names = list(DATASET_NAMES.values())
    row: dict[str, object] = {"Protocol": protocols[0]}
    row.update({r.name: pct(r.test_score) for r in results})
    csv_path = os.path.join(output_dir, TABLE2)
    keyed = {"replace": replace, "hint": hint}
    sources = sources or {}
    figures = {r.name: sources[r.name] for r in results if r.name in sources}
    rows = update_table(
        csv_path,
        transfer_columns(names),
        row | owner.cells("Model", name),
        **keyed,
        sources=figures,
    )
    # Average over the datasets present in the (merged) row; the count says how many.
    mine = next(r for r in rows if r["Model"] == name)
    present = [float(mine[n]) for n in names if mine.get(n)]
    avg = {"Average": f"{sum(present) / len(present):.2f}", "n_datasets": str(len(present))}
    rows = update_table(
        csv_path,
        transfer_columns(names),
        avg | owner.cells("Model", name),
        title="Linear classification on other tasks (paper Table 2)",
    )
    plot_transfer_bars(os.path.join(output_dir, "table2_transfer.png"), rows, names)
    details = os.path.join(output_dir, "transfer_details.csv")
    for r in results:
        d = asdict(r)
        d["lrs"] = " ".join(f"{x:.4g}" for x in r.lrs)
        d["val_scores"] = " ".join(pct(x) for x in r.val_scores)
        d["test_score"] = pct(r.test_score)
        run = owner.cells("run", f"{name}/{r.key}")
        at = {"test_score": sources[r.name]} if r.name in sources else {}
        update_table(details, ["run", *d], d | run, **keyed, sources=at)
    return os.path.splitext(csv_path)[0] + ".md"
