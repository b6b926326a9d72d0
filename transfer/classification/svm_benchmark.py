"""The work of ``tools/svm_voc07.py``: VOC2007 read, res5 features extracted once (cached),
the full SVM benchmark and the low-shot draws (:mod:`.svm`), each finished piece written at once
(``svm_full.json``, ``low_shot/k<k>_draw<d>.json``) and read back by a resumed run, then the
tables with the published references beside them and the plot of mAP against k.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from fvcore.common.config import CfgNode
from torchvision import transforms as T

from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
from pretrain.utils.errors import DatasetError
from pretrain.utils.progress import progress
from transfer.tables import RowOwner, update_table

from .backbone import EvalBackbone
from .features import FeatureCache, cached_features, labels_digest
from .references import SVM_LOW_SHOT_K, VOC07_SVM_REFERENCES
from .svm import (
    as_numpy,
    low_shot_aps,
    low_shot_draw,
    low_shot_summary,
    normalize_features,
    res5_features,
    train_test_svms,
)
from .transforms import ToRGB
from .voc07 import NEGATIVE, POSITIVE, VOC_CLASSES, VOC_LAYOUT, VOCImages

__all__ = [
    "FULL_FILE",
    "LOW_SHOT_DIR",
    "TABLE",
    "VOC07Data",
    "comparability",
    "read_voc07",
    "run_svm_benchmark",
    "write_svm_tables",
]

logger = logging.getLogger(__name__)

FULL_FILE = "svm_full.json"
LOW_SHOT_DIR = "low_shot"
TABLE = "voc07_svm.csv"  # in the table dir, with its Markdown twin
LOW_SHOT_TABLE = "voc07_svm_low_shot.csv"
PLOT = "voc07_svm_low_shot.png"


@dataclass
class VOC07Data:
    root: str
    trainval: VOCImages
    test: VOCImages


def read_voc07(root: str, cfg: CfgNode | None = None, low_shot: bool = False) -> VOC07Data:
    """trainval and test of the VOC2007 folder ``root``; with ``low_shot`` every class must have
    the positives and negatives the largest k of ``cfg.SVM.LOW_SHOT_K`` draws (checked now, so a
    too small copy fails before any work)."""
    for sub in ("Annotations", "JPEGImages", os.path.join("ImageSets", "Main")):
        if not os.path.isdir(os.path.join(root, sub)):
            raise DatasetError(f"--data-root {root}: no {sub}/; expected {VOC_LAYOUT}")
    data = VOC07Data(root, VOCImages(root, "trainval"), VOCImages(root, "test"))
    if low_shot and cfg is not None:
        k = max(cfg.SVM.LOW_SHOT_K)
        labels = data.trainval.targets
        for c, name in enumerate(VOC_CLASSES):
            pos, neg = (int((labels[:, c] == v).sum()) for v in (POSITIVE, NEGATIVE))
            if pos < k or neg < (len(VOC_CLASSES) - 1) * k:
                raise DatasetError(
                    f"{root}: class {name} has {pos} positive and {neg} negative trainval "
                    f"images, a low-shot draw of k = {k} needs {k} and "
                    f"{(len(VOC_CLASSES) - 1) * k}: lower SVM.LOW_SHOT_K"
                )
    return data


def _transform(size: int) -> T.Compose:
    """VISSL's SVM pipeline: resize to size x size (no crop), ImageNet normalisation."""
    return T.Compose(
        [
            ToRGB(),
            T.Resize((size, size)),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN_RGB, IMAGENET_STD_RGB),
        ]
    )


def _features(
    cfg: CfgNode, backbone: EvalBackbone, data: VOC07Data, device: torch.device | str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    pool = cfg.SVM.POOL
    pooled = dataclasses.replace(
        backbone,
        model=res5_features(backbone.model, pool),
        identity=f"{backbone.identity}:res5-{pool}",
    )
    cache = FeatureCache(cfg.FEATURES.CACHE_DIR or os.path.join(cfg.OUTPUT_DIR, "feature_cache"))
    out = {}
    for split, ds in (("trainval", data.trainval), ("test", data.test)):
        parts = {"dataset": "voc2007", "split": split, "root": os.path.abspath(data.root)}
        parts.update(num=len(ds), labels=labels_digest(ds.targets))
        feats, labels = cached_features(
            cache,
            pooled,
            ds,
            _transform(cfg.SVM.IMAGE_SIZE),
            parts,
            device,
            cfg.FEATURES.BATCH_SIZE,
            cfg.FEATURES.NUM_WORKERS,
        )
        if not np.array_equal(labels.numpy(), ds.targets):
            raise RuntimeError(f"voc2007/{split}: labels from the loader differ from the index")
        x = as_numpy(feats)
        out[split] = (normalize_features(x) if cfg.SVM.NORMALIZE else x, ds.targets)
    return out


def _read(path: str, resume: bool) -> dict | None:
    if not resume or not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def _write(path: str, payload: Mapping) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write_bytes(path, (json.dumps(payload, indent=2) + "\n").encode())


Features = dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (features, labels)


def _full(cfg: CfgNode, feats: Features, resume: bool) -> dict:
    path = os.path.join(cfg.OUTPUT_DIR, FULL_FILE)
    done = _read(path, resume)
    if done is not None:
        logger.info("VOC07 SVMs: finished before (%s), read back", path)
        return done
    s = cfg.SVM
    (xtr, ytr), (xte, yte) = feats["trainval"], feats["test"]
    total = ytr.shape[1] * len(s.COSTS)
    with progress(total=total, desc="VOC07 SVMs (class x cost, 3-fold CV)", unit="svm") as bar:
        result = train_test_svms(
            xtr, ytr, xte, yte, s.COSTS, s.FOLDS, s.MAX_ITER, s.POSITIVE_WEIGHT, bar.update
        )
    _write(path, result)
    logger.info("VOC07 SVM mAP %.2f (test, area AP, difficult left out)", 100 * result["map"])
    return result


def _low_shot(cfg: CfgNode, feats: Features, ids: list[str], resume: bool) -> dict:
    s = cfg.SVM
    (xtr, ytr), (xte, yte) = feats["trainval"], feats["test"]
    out = {}
    units = [(k, d) for k in s.LOW_SHOT_K for d in range(s.LOW_SHOT_DRAWS)]
    with progress(total=len(units), desc="VOC07 low-shot SVMs (k x draw)", unit="draw") as bar:
        for k in s.LOW_SHOT_K:
            per_draw = []
            for d in range(s.LOW_SHOT_DRAWS):
                path = os.path.join(cfg.OUTPUT_DIR, LOW_SHOT_DIR, f"k{k}_draw{d}.json")
                done = _read(path, resume)
                if done is None:
                    seed = cfg.SEED + d
                    draw = low_shot_draw(ytr, k, seed)
                    maps = low_shot_aps(
                        xtr, draw, xte, yte, s.LOW_SHOT_COSTS, s.MAX_ITER, s.POSITIVE_WEIGHT
                    )
                    done = {
                        "k": k,
                        "draw": d,
                        "seed": seed,
                        "costs": list(s.LOW_SHOT_COSTS),
                        "map_per_cost": maps,
                        "positives": {
                            n: [ids[i] for i in np.flatnonzero(draw[:, c] == POSITIVE)]
                            for c, n in enumerate(VOC_CLASSES)
                        },
                        "negatives": {
                            n: [ids[i] for i in np.flatnonzero(draw[:, c] == NEGATIVE)]
                            for c, n in enumerate(VOC_CLASSES)
                        },
                    }
                    _write(path, done)
                per_draw.append(done["map_per_cost"])
                bar.update()
            out[str(k)] = low_shot_summary(per_draw, s.LOW_SHOT_COSTS)
            logger.info(
                "low-shot k = %d: mAP %.2f ± %.2f over %d draws (cost %g)",
                k,
                100 * out[str(k)]["mean"],
                100 * out[str(k)]["std"],
                len(per_draw),
                out[str(k)]["cost"],
            )
    return out


def run_svm_benchmark(
    cfg: CfgNode,
    backbone: EvalBackbone,
    data: VOC07Data,
    device: torch.device | str,
    low_shot: bool = False,
    resume: bool = False,
) -> dict:
    """Features, the full benchmark and (``low_shot``) the low-shot draws; returns the results
    (what ``results.json`` holds). With ``resume`` (the run directory of the same config) the
    full result and the draws an earlier run finished are read back."""
    backbone.model.to(device)
    feats = _features(cfg, backbone, data, device)
    result = {
        "full": _full(cfg, feats, resume),
        "pool": cfg.SVM.POOL,
        "image_size": cfg.SVM.IMAGE_SIZE,
    }
    result["feature_dim"] = int(feats["test"][0].shape[1])
    if low_shot:
        result["low_shot"] = _low_shot(cfg, feats, data.trainval.ids, resume)
    return result


def comparability(cfg: CfgNode, arch: str) -> str:
    """Whether this run's figures compare with the published rows (ResNet-50, OpenSelfSup's
    8192-d res5 pooling, 224 px); the reasons when they do not."""
    why = []
    if arch != "resnet50":
        why.append(f"{arch}, not ResNet-50")
    if cfg.SVM.POOL != "avgpool6":
        why.append(f"res5 pooled {cfg.SVM.POOL} (published: avgpool6, 8192-d)")
    if cfg.SVM.IMAGE_SIZE != 224:
        why.append(f"{cfg.SVM.IMAGE_SIZE} px (published: 224)")
    return "yes" if not why else "no: " + "; ".join(why)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def write_svm_tables(
    table_dir: str,
    owner: RowOwner,
    result: Mapping,
    cfg: CfgNode,
    arch: str,
    *,
    replace: bool,
    hint: str,
    sources: Mapping[str, str],
) -> str:
    """``voc07_svm.{csv,md}`` (this model's row and the published ones), with ``--low-shot``
    ``voc07_svm_low_shot.{csv,md}`` (mean ± std per k beside the published means) and the plot
    ``voc07_svm_low_shot.png``; returns the main Markdown table's path."""
    ks = [f"k={k}" for k in SVM_LOW_SHOT_K]
    columns = ["Model", "VOC07 SVM", *ks, "Comparable", "Reference"]
    title = "VOC07 linear SVMs (mAP, area AP, difficult left out) and low-shot (mean of 5 draws)"
    cells: dict[str, object] = {"VOC07 SVM": _pct(result["full"]["map"])}
    low = result.get("low_shot", {})
    cells |= {f"k={k}": _pct(v["mean"]) for k, v in low.items()}
    cells["Comparable"] = comparability(cfg, arch)
    path = os.path.join(table_dir, TABLE)
    keyed = {"replace": replace, "hint": hint}
    theirs = {k: v for k, v in sources.items() if k in cells}
    update_table(path, columns, cells | owner.cells("Model"), title, **keyed, sources=theirs)
    for ref in VOC07_SVM_REFERENCES:
        row = {k: f"{v:.2f}" for k, v in ref.values.items()}
        row |= {
            "Model": ref.name,
            "Comparable": "published",
            "Reference": f"{ref.source}; {ref.note}",
        }
        update_table(path, columns, row, title)
    if low:
        _low_shot_table(table_dir, owner.name, low)
    return os.path.splitext(path)[0] + ".md"


def _low_shot_table(table_dir: str, name: str, low: Mapping[str, Mapping]) -> None:
    """One row per (model, k): this run's mean, std, min, max over draws and the cost, beside
    the published means at that k."""
    refs = {r.name: r.values for r in VOC07_SVM_REFERENCES}
    columns = ["run", "Model", "k", "mean", "std", "min", "max", "draws", "cost"]
    path = os.path.join(table_dir, LOW_SHOT_TABLE)
    title = "VOC07 low-shot SVMs: test mAP over the draws of each k"
    for k, v in low.items():
        row = {"run": f"{name} / k={k}", "Model": name, "k": k}
        row |= {m: _pct(v[m]) for m in ("mean", "std", "min", "max")}
        update_table(path, columns, row | {"draws": v["draws"], "cost": v["cost"]}, title)
        for ref_name, values in refs.items():
            if f"k={k}" in values:
                ref = {"run": f"{ref_name} / k={k}", "Model": ref_name, "k": k}
                update_table(path, columns, ref | {"mean": f"{values[f'k={k}']:.2f}"}, title)
    _plot(os.path.join(table_dir, PLOT), name, low, refs)


def _plot(png: str, name: str, low: Mapping[str, Mapping], refs: Mapping[str, Mapping]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    ks = [int(k) for k in low]
    means = [100 * low[k]["mean"] for k in low]
    stds = [100 * low[k]["std"] for k in low]
    ax.errorbar(ks, means, yerr=stds, marker="o", capsize=3, label=name)
    for ref_name, values in refs.items():
        pts = [(k, values[f"k={k}"]) for k in SVM_LOW_SHOT_K if f"k={k}" in values]
        ax.plot(*zip(*pts, strict=True), linestyle="--", marker=".", label=ref_name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(SVM_LOW_SHOT_K))
    ax.set_xticklabels([str(k) for k in SVM_LOW_SHOT_K])
    ax.set_xlabel("positives per class (k)")
    ax.set_ylabel("VOC07 test mAP (%)")
    ax.set_title("VOC07 low-shot linear SVMs")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
