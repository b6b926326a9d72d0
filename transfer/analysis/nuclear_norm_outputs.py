"""Run the nuclear-norm analysis over several models and write its figures (:data:`FIGURES`:
Fig. 4c, 3b and, when an accuracy is known, 3c), each PNG beside a CSV of exactly its data.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from pretrain.data.loader import resolve_num_workers
from pretrain.evaluation.knn import KNN_K
from transfer.analysis import AnalysisError, plots
from transfer.analysis.models import load_pretrained
from transfer.analysis.nuclear_norm_stats import (
    ModelStats,
    accuracy_for,
    augmented_nuclear_norms,
    knn_top1,
    open_split,
    read_accuracy_csv,
    summary_row,
    view_spec,
)
from transfer.tables import write_csv

__all__ = ["FIGURES", "AnalysisOptions", "Written", "analyze", "write_outputs"]

# figure key -> file stem (PNG + CSV); tools/make_report.py looks for these names.
FIGURES = {
    "hist": "nuclear_norm_hist",
    "beta": "nuclear_norm_vs_beta",
    "accuracy": "accuracy_vs_nuclear_norm",
}


@dataclass
class AnalysisOptions:
    dataset: str
    data_root: str
    views: int = 32
    max_images: int = 0
    class_list: str = ""
    seed: int = 0
    batch_images: int = 8
    num_workers: int = 0  # -1: one per core of this process less one
    device: str = "cpu"
    accuracy_csv: str = ""
    knn_train: int = 0
    knn_k: int = KNN_K
    labels: Sequence[str] = field(default_factory=list)


def analyze(paths: Sequence[str], opt: AnalysisOptions) -> list[ModelStats]:
    """Load each model in turn (one in memory at a time) and measure it on the same images."""
    if opt.labels and len(opt.labels) != len(paths):
        raise AnalysisError(f"--labels gives {len(opt.labels)} names for {len(paths)} models")
    if opt.views < 2:
        raise AnalysisError(f"--views {opt.views}: need at least 2 views per image")
    accuracy = read_accuracy_csv(opt.accuracy_csv) if opt.accuracy_csv else {}
    test, indices = open_split(opt.dataset, opt.data_root, "test", opt.class_list, opt.max_images)
    classes = [test.label(i) for i in indices]
    workers = resolve_num_workers(opt.num_workers, name="--num-workers")  # -1: fit to the cores
    train = train_idx = None
    if opt.knn_train:
        train, train_idx = open_split(
            opt.dataset, opt.data_root, "train", opt.class_list, opt.knn_train
        )
    results: list[ModelStats] = []
    for n, path in enumerate(paths):
        m = load_pretrained(path, opt.labels[n] if opt.labels else "", opt.device)
        if any(r.label == m.label for r in results):
            raise AnalysisError(f"two models are labelled {m.label!r}; name them with --labels")
        crop, color = view_spec(m.cfg, opt.views)
        values = augmented_nuclear_norms(
            m.model.encoder_q,
            test,
            indices,
            crop,
            color,
            seed=opt.seed,
            batch_images=opt.batch_images,
            num_workers=workers,
            device=opt.device,
            desc=f"[{n + 1}/{len(paths)}] {m.label}",
        )
        stats = ModelStats(m.label, m.checkpoint, m.prior, m.beta, indices, classes, values)
        stats.prior_never_on = m.prior_never_on  # its beta column and figure place say so
        if train is not None:
            stats.top1 = knn_top1(
                m.model.backbone_features,
                (train, train_idx),
                (test, indices),
                size=m.cfg.INPUT.LARGE_SIZE,
                crop_fraction=1.0 if opt.dataset == "fashion-mnist" else 0.875,
                device=opt.device,
                k=opt.knn_k,
                num_workers=workers,
            )
            stats.top1_source = f"kNN k={opt.knn_k} ({len(train_idx)} train images)"
        elif accuracy:
            stats.top1 = accuracy_for(accuracy, m.label, path)
            stats.top1_source = os.path.basename(opt.accuracy_csv) if stats.top1 is not None else ""
        results.append(stats)
        del m
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if accuracy and not any(r.top1 is not None for r in results):
        raise AnalysisError(
            f"{opt.accuracy_csv}: no row matches any model ({[r.label for r in results]})"
        )
    return results


@dataclass
class Written:
    png: str
    csv: str
    plotted: int  # data values drawn (histogram: image count over all models; else models)


def write_outputs(results: Sequence[ModelStats], out_dir: str, views: int) -> dict[str, Written]:
    """Write the figures and their CSVs; returns ``{figure key: Written}``."""
    if not results:
        raise AnalysisError("no models to plot")
    os.makedirs(out_dir, exist_ok=True)

    def path(key: str, ext: str) -> str:
        return os.path.join(out_dir, f"{FIGURES[key]}.{ext}")

    written = {}
    rows = [
        {
            "model": r.label,
            "beta": r.beta_text,
            "image_index": i,
            "class": c,
            "nuclear_norm": f"{v:.6f}",
        }
        for r in results
        for i, c, v in zip(r.indices, r.classes, r.values, strict=True)
    ]
    write_csv(path("hist", "csv"), ["model", "beta", "image_index", "class", "nuclear_norm"], rows)
    counts = plots.plot_histograms(
        {r.label: r.values for r in results}, path("hist", "png"), views=views
    )
    written["hist"] = Written(path("hist", "png"), path("hist", "csv"), sum(counts.values()))

    summary = [summary_row(r) for r in results]
    write_csv(path("beta", "csv"), list(summary[0]), summary)
    n = plots.plot_vs_beta(
        [
            plots.Point(_name(r), r.trained_beta, float(r.values.mean()), r.trained_beta)
            for r in results
        ],
        path("beta", "png"),
        ylabel=f"mean {plots.NUC} ({views} views)",
        title="Nuclear norm on test images vs \u03b2 (paper Fig. 3b)",
    )
    written["beta"] = Written(path("beta", "png"), path("beta", "csv"), n)

    with_acc = [r for r in results if r.top1 is not None]
    if with_acc:
        acc_rows = [
            {
                "model": r.label,
                "beta": r.beta_text,
                "mean_nuclear_norm": f"{r.values.mean():.4f}",
                "top1": f"{r.top1:.2f}",
                "accuracy_source": r.top1_source,
            }
            for r in with_acc
        ]
        write_csv(path("accuracy", "csv"), list(acc_rows[0]), acc_rows)
        n = plots.plot_accuracy_vs_nuclear(
            [
                plots.Point(_name(r), float(r.values.mean()), r.top1, r.trained_beta)
                for r in with_acc
            ],
            path("accuracy", "png"),
            ylabel="top-1 accuracy (%)",
            title="Accuracy vs nuclear norm (paper Fig. 3c)",
        )
        written["accuracy"] = Written(path("accuracy", "png"), path("accuracy", "csv"), n)
    else:  # a figure left by an earlier call would pair old accuracies with new norms
        for ext in ("png", "csv"):
            if os.path.exists(path("accuracy", ext)):
                os.remove(path("accuracy", ext))
    return written


def _name(r: ModelStats) -> str:
    """A model's label in a figure, marked when its prior never turned on (drawn at inf)."""
    return f"{r.label} (prior never on)" if r.prior_never_on else r.label
