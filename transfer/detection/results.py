"""Collect finished fine-tuning runs into a table shaped like the paper's Table 5.

Each run directory holds detectron2's ``config.yaml`` and either the ``results.json`` written by
:func:`write_results` at the end of ``tools/train_net.py`` or, as a fallback, the last evaluation
detectron2's ``EvalHook`` logged to ``metrics.json`` (keys such as ``bbox/AP``).

Rows are pretrainings (the weights file's name, ``random`` without weights, or a label given as
``LABEL=RUN_DIR``); columns are AP, AP50, AP75 of boxes from Faster R-CNN, of masks from Mask
R-CNN and of keypoints from Keypoint R-CNN, as in Table 5.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import yaml

from pretrain.errors import ResultsError  # noqa: F401 (re-exported)

__all__ = [
    "RESULTS_FILE",
    "TABLE_COLUMNS",
    "ResultsError",
    "RunResult",
    "build_table",
    "describe_run",
    "read_run",
    "write_results",
    "write_table",
]

RESULTS_FILE = "results.json"
_METRICS = ("AP", "AP50", "AP75")
# (detector, evaluated task, column title) in Table 5's order.
TABLE_COLUMNS = (
    ("faster_rcnn", "bbox", "Faster R-CNN box"),
    ("mask_rcnn", "segm", "Mask R-CNN mask"),
    ("keypoint_rcnn", "keypoints", "Keypoint R-CNN keypoints"),
)


@dataclass
class RunResult:
    """The final COCO metrics of one run: ``metrics[task][metric]`` in percent."""

    run_dir: str
    pretraining: str
    detector: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)


def describe_run(cfg: Mapping) -> tuple[str, str]:
    """``(pretraining, detector)`` of a detectron2 config given as a CfgNode or plain dict."""
    model = cfg["MODEL"]
    weights = model.get("WEIGHTS", "")
    pretraining = os.path.splitext(os.path.basename(weights))[0] if weights else "random"
    if model.get("KEYPOINT_ON"):
        detector = "keypoint_rcnn"
    elif model.get("MASK_ON"):
        detector = "mask_rcnn"
    else:
        detector = "faster_rcnn"
    return pretraining, detector


def write_results(
    output_dir: str, cfg: Mapping, results: Mapping, dataset_names: Sequence[str]
) -> str:
    """Save the final evaluation of a run as ``OUTPUT_DIR/results.json``; returns the path.

    ``results`` is what ``DefaultTrainer.test`` returns: ``{task: {metric: value}}`` for one test
    dataset or ``{dataset: {task: {metric: value}}}`` for several.
    """
    per_dataset = {dataset_names[0]: dict(results)} if len(dataset_names) == 1 else dict(results)
    pretraining, detector = describe_run(cfg)
    payload = {
        "pretraining": pretraining,
        "detector": detector,
        "weights": cfg["MODEL"].get("WEIGHTS", ""),
        "max_iter": cfg["SOLVER"]["MAX_ITER"],
        "results": {
            name: {task: {k: float(v) for k, v in m.items()} for task, m in tasks.items()}
            for name, tasks in per_dataset.items()
        },
    }
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, RESULTS_FILE)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    return path


def _from_metrics_json(path: str) -> dict[str, dict[str, float]]:
    last: dict[str, dict[str, float]] = {}
    with open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            found: dict[str, dict[str, float]] = {}
            for key, value in record.items():
                parts = key.split("/")
                if len(parts) >= 2 and parts[-2] in ("bbox", "segm", "keypoints"):
                    found.setdefault(parts[-2], {})[parts[-1]] = float(value)
            if found:
                last = found
    return last


def read_run(run_dir: str, label: str | None = None, dataset: str | None = None) -> RunResult:
    """The final metrics of ``run_dir`` (``results.json``, else ``metrics.json``)."""
    results_path = os.path.join(run_dir, RESULTS_FILE)
    if os.path.isfile(results_path):
        with open(results_path) as f:
            data = json.load(f)
        per_dataset = data["results"]
        if dataset is None and len(per_dataset) > 1:
            raise ResultsError(
                f"{run_dir}: evaluated on several datasets {sorted(per_dataset)}; pick one with "
                "--dataset"
            )
        name = dataset or next(iter(per_dataset))
        if name not in per_dataset:
            raise ResultsError(f"{run_dir}: no results for dataset {name!r}")
        return RunResult(run_dir, label or data["pretraining"], data["detector"], per_dataset[name])
    config_path, metrics_path = (os.path.join(run_dir, n) for n in ("config.yaml", "metrics.json"))
    if not (os.path.isfile(config_path) and os.path.isfile(metrics_path)):
        raise ResultsError(f"{run_dir}: neither {RESULTS_FILE} nor config.yaml + metrics.json")
    with open(config_path) as f:
        pretraining, detector = describe_run(yaml.safe_load(f))
    metrics = _from_metrics_json(metrics_path)
    if not metrics:
        raise ResultsError(f"{run_dir}: metrics.json holds no evaluation results")
    return RunResult(run_dir, label or pretraining, detector, metrics)


def build_table(runs: Sequence[RunResult]) -> tuple[list[str], list[list[float | None]]]:
    """Row labels (pretrainings, in order of appearance) and Table 5 values (``None``: no run)."""
    labels: list[str] = []
    cells: dict[tuple[str, str], RunResult] = {}
    for run in runs:
        if run.pretraining not in labels:
            labels.append(run.pretraining)
        key = (run.pretraining, run.detector)
        if key in cells:
            raise ResultsError(
                f"two {run.detector} runs for {run.pretraining!r}: {cells[key].run_dir} and "
                f"{run.run_dir}; label them apart with LABEL=RUN_DIR"
            )
        cells[key] = run
    rows = []
    for label in labels:
        row: list[float | None] = []
        for detector, task, _ in TABLE_COLUMNS:
            run = cells.get((label, detector))
            values = run.metrics.get(task, {}) if run else {}
            row += [values.get(m) for m in _METRICS]
        rows.append(row)
    return labels, rows


def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return ""
    return "nan" if math.isnan(value) else f"{value:.{digits}f}"


def write_table(runs: Sequence[RunResult], prefix: str) -> tuple[str, str]:
    """Write ``PREFIX.md`` and ``PREFIX.csv``; returns their paths."""
    labels, rows = build_table(runs)
    header = [f"{title} {m}" for _, _, title in TABLE_COLUMNS for m in _METRICS]
    if os.path.dirname(prefix):
        os.makedirs(os.path.dirname(prefix), exist_ok=True)
    md_path, csv_path = prefix + ".md", prefix + ".csv"
    lines = [
        "| pretraining | " + " | ".join(header) + " |",
        "|---|" + "---:|" * len(header),
    ]
    for label, row in zip(labels, rows, strict=True):
        cells = [_fmt(v, 1) or "–" for v in row]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["pretraining", *header])
        for label, row in zip(labels, rows, strict=True):
            writer.writerow([label, *(_fmt(v, 3) for v in row)])
    return md_path, csv_path
