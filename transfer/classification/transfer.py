"""The 12-dataset linear transfer harness (paper Sec. 6.1, Table 2).

Per dataset: one linear classifier per lr of the sweep (7 log-spaced values in [0.1, 100]) on
``train``, the best by the dataset's metric on ``val`` retrained on ``train + val`` and scored on
``test``; SGD, batch 256, momentum 0.9, cosine, the paper's per-dataset budgets.
``TRANSFER.PROTOCOL``: ``cached_features`` (default) trains on centre-crop features computed once
and cached (:mod:`.features`), as Kornblith et al. and SimCLR; ``augmented`` (the paper's wording,
:mod:`.augmented`) on RandomResizedCrop + flip images through the frozen backbone at every step;
``finetune`` (:mod:`.finetune`) trains the whole network, lr and weight decay searched on val.
A finished dataset leaves ``<output>/datasets/<key>.json``; a resumed run reads it back.
"""

from __future__ import annotations

import json
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
from pretrain.utils.atomic_io import atomic_write_bytes
from transfer.tables import CLASH_HINT, RowOwner, check_row, data_source, update_table

from .augmented import centre_crop_features, train_heads_augmented
from .backbone import EvalBackbone
from .config import TRANSFER_PROTOCOLS
from .engine import run_stage, step_log
from .features import FeatureCache, cached_features, check_index_labels, labels_digest
from .finetune import FineTuning, SearchPoint, finetune_search, search_grid
from .linear import best_index, iterations_for, log_spaced, predict, train_linear_heads
from .metrics import score
from .references import FINETUNE_REFERENCES
from .report import pct, plot_transfer_bars, transfer_columns
from .transfer_datasets import (
    ALL_DATASET_NAMES,
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
    "comparability",
    "dataset_root",
    "finetune_dataset",
    "run_transfer",
    "stage_dir",
    "table_file",
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
    protocol: str  # TRANSFER.PROTOCOL: "cached_features", "augmented" or "finetune"
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
    wds: list[float] = field(default_factory=list)  # finetune: each point's weight decay
    best_wd: float = 0.0


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
        check_index_labels(f"{data.key}/{src}", labels, expected)
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
    ``cached_features`` protocol's, ``None`` for the others). Each search point is a stage
    (:func:`.engine.run_stage`): one finished before is read back, the one interrupted runs
    again (cached features: from its start, deterministic) or continues (augmented: from its
    last checkpoint with ``resume``); ``finetune`` reads its finished points back."""
    t = cfg.TRANSFER
    if t.PROTOCOL == "finetune":
        return finetune_dataset(data, backbone, cfg, device, resume)
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
            return centre_crop_features(data, split, backbone.model, cfg, device)

        return _sweep_and_select(data, cfg, train_augmented, centre_crops)
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

    return _sweep_and_select(data, cfg, train_cached, cached)


def _sweep_and_select(
    data: TransferData, cfg: CfgNode, train: TrainFn, evaluate: EvalFn
) -> DatasetResult:
    """The sweep on ``train`` scored on val, the best lr retrained on train+val, scored on test;
    each a stage (:func:`.engine.run_stage`)."""
    t = cfg.TRANSFER
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


def finetune_dataset(
    data: TransferData,
    backbone: EvalBackbone,
    cfg: CfgNode,
    device: torch.device | str,
    resume: bool = False,
) -> DatasetResult:
    """``TRANSFER.PROTOCOL finetune`` on one dataset: every (lr, wd) point of the search
    fine-tuned on train and scored on val, the best retrained on train+val and scored on test;
    finished points are read back (:meth:`.finetune.FineTuning.point_score`)."""
    points = search_grid(cfg)
    root = os.path.join(cfg.OUTPUT_DIR, "finetune", data.key)
    runs = FineTuning(data, backbone, cfg, device, resume)

    def on_val(p: SearchPoint) -> float:
        return runs.point_score(["train"], "val", p, os.path.join(root, p.tag))

    val_scores, best = finetune_search(points, on_val)
    chosen = points[best]
    test = runs.point_score(["train", "val"], "test", chosen, os.path.join(root, "final"))
    logger.info(
        "%s (finetune): val %s best at lr %.4g, wd %.4g; test %.2f%%",
        data.name,
        data.metric,
        chosen.lr,
        chosen.wd,
        100 * test,
    )
    n_train, n_val = data.split_size("train"), data.split_size("val")
    return DatasetResult(
        key=data.key,
        name=data.name,
        metric=data.metric,
        val_protocol=data.val_protocol,
        protocol="finetune",
        num_classes=data.num_classes,
        n_train=n_train,
        n_val=n_val,
        n_test=data.split_size("test"),
        iters_sweep=cfg.FINETUNE.ITERS,
        iters_final=cfg.FINETUNE.ITERS,
        lrs=[p.lr for p in points],
        val_scores=val_scores,
        best_lr=chosen.lr,
        test_score=test,
        wds=[p.wd for p in points],
        best_wd=chosen.wd,
    )


DATASETS_DIR = "datasets"  # <output>/datasets/<key>.json: a finished dataset's result


def _finished(cfg: CfgNode, key: str) -> DatasetResult | None:
    path = os.path.join(cfg.OUTPUT_DIR, DATASETS_DIR, f"{key}.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        result = DatasetResult(**json.load(f))
    logger.info("%s: finished before (%s), read back", key, path)
    return result


def _record(cfg: CfgNode, result: DatasetResult) -> None:
    path = os.path.join(cfg.OUTPUT_DIR, DATASETS_DIR, f"{result.key}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, json.dumps(asdict(result), indent=2).encode())


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
    :func:`build_transfer_datasets`); missing roots fail before any work. Each finished dataset
    is recorded in ``OUTPUT_DIR``; with ``resume`` (the run directory of the same config) those
    an earlier run finished are read back and the interrupted one goes on
    (:func:`transfer_dataset`); ``log_to``: the optional writers."""
    cache = None
    if cfg.TRANSFER.PROTOCOL == "cached_features":
        cache = FeatureCache(_cache_dir(cfg), cfg.FEATURES.DTYPE)
    datas = datas if datas is not None else build_transfer_datasets(cfg)
    backbone.model.to(device)
    results = []
    for d in datas:
        result = _finished(cfg, d.key) if resume and cfg.OUTPUT_DIR else None
        if result is None:
            result = transfer_dataset(d, backbone, cfg, cache, device, resume, log_to)
            if cfg.OUTPUT_DIR:
                _record(cfg, result)
        results.append(result)
    if comm.is_main_process():
        scalars = {f"eval/{r.key}/test": r.test_score for r in results}
        scalars |= {f"eval/{r.key}/val": max(r.val_scores) for r in results}
        write_scalars(cfg.OUTPUT_DIR, scalars, log_to=log_to, config=yaml.safe_load(cfg.dump()))
    return results


TABLE2 = "table2_transfer.csv"  # in the table dir, with its Markdown twin and bar chart
TABLE_FINETUNE = "table_transfer_finetune.csv"  # the fine-tuning protocol's, references beside


def table_file(protocol: str) -> str:
    """The table of ``protocol``'s results: Table 2 for the linear protocols."""
    return TABLE_FINETUNE if protocol == "finetune" else TABLE2


def table_row_name(model_name: str, protocol: str) -> str:
    """The row of a model: its name for the default protocol and for ``finetune`` (a table of
    its own), ``name (protocol)`` otherwise, so both linear protocols sit side by side."""
    if protocol in ("cached_features", "finetune"):
        return model_name
    return f"{model_name} ({protocol})"


def table_sources(cfg: CfgNode) -> dict[str, str]:
    """Table 2's figures of ``cfg``'s datasets and the data each is computed on (its root):
    the keys of the row's cells (:func:`transfer.tables.update_table`)."""
    return {
        ALL_DATASET_NAMES[k]: data_source(k, dataset_root(cfg, k)) for k in cfg.TRANSFER.DATASETS
    }


def comparability(cfg: CfgNode, arch: str) -> str:
    """Whether a fine-tuning row compares with the published one (ResNet-50, 224 px crops,
    20,000 steps at batch 256, the 7 x 8 search); the reasons when it does not."""
    f, why = cfg.FINETUNE, []
    if arch != "resnet50":
        why.append(f"{arch}, not ResNet-50")
    if cfg.INPUT.CROP != 224:
        why.append(f"{cfg.INPUT.CROP} px crops (published: 224)")
    if (f.ITERS, f.BATCH_SIZE) != (20000, 256):
        why.append(f"{f.ITERS} steps of batch {f.BATCH_SIZE} (published: 20,000 of 256)")
    if len(search_grid(cfg)) != 56:
        why.append(f"{len(search_grid(cfg))} search points (published: 7 lrs x 8 wds)")
    return "yes" if not why else "no: " + "; ".join(why)


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
    path = os.path.join(output_dir, table_file(protocol))
    check_row(path, "Model", row, replace=replace, hint=hint, sources=sources)


def write_tables(
    output_dir: str,
    model: str | RowOwner,
    results: list[DatasetResult],
    *,
    replace: bool = False,
    hint: str = CLASH_HINT,
    sources: Mapping[str, str] | None = None,
    comparable: str = "",
) -> str:
    """Update ``table2_transfer.{csv,md,png}`` (``table_transfer_finetune.*`` for ``finetune``,
    with the published rows of :data:`.references.FINETUNE_REFERENCES`; row
    :func:`table_row_name`) and the details CSV (``replace``, ``hint``, ``sources``:
    :func:`~transfer.tables.update_table`'s; ``comparable``: the row's :func:`comparability`
    with the published rows); returns the Markdown table's path."""
    protocols = sorted({r.protocol for r in results})
    if len(protocols) != 1:
        raise ValueError(f"results must come from one protocol, got {protocols}")
    owner = _owner(model)
    name = table_row_name(owner.name, protocols[0])
    finetune = protocols[0] == "finetune"
    # Table 2's 12 columns, then the other datasets: those run (VOC2007), all for fine-tuning
    # (its published row has VOC2007)
    names = list(DATASET_NAMES.values())
    ran = {r.name for r in results}
    names += [n for n in ALL_DATASET_NAMES.values() if n not in names and (finetune or n in ran)]
    row: dict[str, object] = {"Protocol": protocols[0]}
    if finetune:
        row["Comparable"] = comparable
    row.update({r.name: pct(r.test_score) for r in results})
    csv_path = os.path.join(output_dir, table_file(protocols[0]))
    title = (
        "Fine-tuning on other tasks (Kornblith et al. 2019 / SimCLR protocol)"
        if finetune
        else "Linear classification on other tasks (paper Table 2)"
    )
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
    rows = update_table(csv_path, transfer_columns(names), avg | owner.cells("Model", name), title)
    if finetune:
        for ref in FINETUNE_REFERENCES:
            cells = {k: f"{v:.2f}" for k, v in ref.values.items()}
            cells |= {"Model": ref.name, "Comparable": "published"}
            cells["Reference"] = f"{ref.source}; {ref.note}"
            rows = update_table(csv_path, transfer_columns(names), cells, title)
    stem = os.path.splitext(csv_path)[0]
    plot_transfer_bars(stem + ".png", rows, names, title.split(" (")[0])
    details = os.path.join(
        output_dir, "transfer_finetune_details.csv" if finetune else "transfer_details.csv"
    )
    for r in results:
        d = asdict(r)
        d["lrs"] = " ".join(f"{x:.4g}" for x in r.lrs)
        d["wds"] = " ".join(f"{x:.4g}" for x in r.wds)
        d["val_scores"] = " ".join(pct(x) for x in r.val_scores)
        d["test_score"] = pct(r.test_score)
        run = owner.cells("run", f"{name}/{r.key}")
        at = {"test_score": sources[r.name]} if r.name in sources else {}
        update_table(details, ["run", *d], d | run, **keyed, sources=at)
    return stem + ".md"
