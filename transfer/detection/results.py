"""Collect finished fine-tuning runs into a table shaped like the paper's Table 4.

A run directory holds the ``results.json`` of :func:`write_results` or, for a run that ended
before it, ``config.yaml`` and the last evaluation in ``metrics.json``. Rows are pretrainings
(:func:`transfer.checkpoint.provenance.run_label` of the weights, ``random`` without, or
``LABEL=RUN_DIR``); columns are AP, AP50, AP75 of Faster R-CNN boxes, Mask R-CNN masks and
Keypoint R-CNN keypoints (``tab:detection``). Runs under one label from other weights (by
sha256, else path) or on other test sets are refused, never merged into one row.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pretrain.utils.errors import ResultsError  # noqa: F401 (re-exported)
from pretrain.utils.yaml_files import read_yaml
from transfer.checkpoint.provenance import run_label
from transfer.metrics_json import read_metrics_json
from transfer.tables import write_csv, write_markdown

__all__ = [
    "RESULTS_FILE",
    "TABLE_COLUMNS",
    "TABLE_HEADER",
    "ResultsError",
    "RunResult",
    "build_table",
    "describe_run",
    "read_results",
    "read_run",
    "write_results",
    "write_table",
]

RESULTS_FILE = "results.json"
_METRICS = ("AP", "AP50", "AP75")
# (detector, evaluated task, column title) in Table 4's order.
TABLE_COLUMNS = (
    ("faster_rcnn", "bbox", "Faster R-CNN box"),
    ("mask_rcnn", "segm", "Mask R-CNN mask"),
    ("keypoint_rcnn", "keypoints", "Keypoint R-CNN keypoints"),
)
# The value columns of the table, e.g. "Mask R-CNN mask AP50", in :func:`build_table`'s order.
TABLE_HEADER = tuple(f"{title} {m}" for _, _, title in TABLE_COLUMNS for m in _METRICS)


@dataclass
class RunResult:
    """The final COCO metrics of one run: ``metrics[task][metric]`` in percent."""

    run_dir: str
    pretraining: str
    detector: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    weights: str = ""  # MODEL.WEIGHTS, normalised ("": random initialisation)
    weights_sha256: str = ""  # of that file, when results.json recorded it
    dataset: str = ""  # the test set the metrics are of ("": not recorded)

    def same_weights(self, other: RunResult) -> bool:
        """Whether both runs started from the same weights: the same file hash where both
        recorded one, else the same path."""
        if self.weights_sha256 and other.weights_sha256:
            return self.weights_sha256 == other.weights_sha256
        return self.weights == other.weights

    def weights_name(self) -> str:
        """The weights for a message: the path, with the hash's first 8 digits when recorded."""
        name = self.weights or "random initialisation"
        return f"{name} (sha256 {self.weights_sha256[:8]})" if self.weights_sha256 else name


def describe_run(cfg: Mapping) -> tuple[str, str]:
    """``(pretraining, detector)`` of a detectron2 config given as a CfgNode or plain dict."""
    model = cfg["MODEL"]
    weights = model.get("WEIGHTS", "")
    pretraining = run_label(weights) if weights else "random"
    if model.get("KEYPOINT_ON"):
        detector = "keypoint_rcnn"
    elif model.get("MASK_ON"):
        detector = "mask_rcnn"
    else:
        detector = "faster_rcnn"
    return pretraining, detector


def _file_sha256(path: str) -> str:
    """The sha256 of a local weights file, ``""`` for anything else (a ``detectron2://`` URL)."""
    if not os.path.isfile(path):
        return ""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _weights_path(cfg: Mapping) -> str:
    path = str(cfg.get("MODEL", {}).get("WEIGHTS", "") or "")
    return os.path.normpath(path) if path else ""


def write_results(
    output_dir: str, cfg: Mapping, results: Mapping, dataset_names: Sequence[str]
) -> str:
    """Save ``DefaultTrainer.test``'s ``results`` (``{task: {metric: value}}`` for one test set,
    keyed by dataset for several, ``{}`` for none) as ``OUTPUT_DIR/results.json`` with the config
    and weights that produced them; returns the path."""
    from transfer.run_dir import RunDir  # here: the collector starts without torch

    if not dataset_names:
        per_dataset = {}
    elif len(dataset_names) == 1:
        per_dataset = {dataset_names[0]: dict(results)}
    else:
        per_dataset = dict(results)
    pretraining, detector = describe_run(cfg)
    return RunDir(output_dir, results=RESULTS_FILE).write_results(
        {
            name: {task: {k: float(v) for k, v in m.items()} for task, m in tasks.items()}
            for name, tasks in per_dataset.items()
        },
        cfg,
        pretraining=pretraining,
        detector=detector,
        weights=cfg["MODEL"].get("WEIGHTS", ""),
        weights_sha256=_file_sha256(cfg["MODEL"].get("WEIGHTS", "")),
        max_iter=cfg["SOLVER"]["MAX_ITER"],
    )


def read_results(run_dir: str) -> dict[str, dict[str, dict[str, float]]]:
    """``{dataset: {task: {metric: value}}}`` of ``run_dir/results.json``."""
    path = os.path.join(run_dir, RESULTS_FILE)
    try:
        with open(path) as f:
            return json.load(f)["results"]
    except (OSError, ValueError, KeyError) as e:
        raise ResultsError(f"{path}: not a readable results file ({e})") from None


def _from_metrics_json(path: str) -> dict[str, dict[str, dict[str, float]]]:
    """The last evaluation logged, ``{test set: {task: {metric: value}}}``; detectron2 logs
    ``<task>/<metric>`` (test set ``""``) for a single test set."""
    last: dict[str, dict[str, dict[str, float]]] = {}
    for record in read_metrics_json(path):
        found: dict[str, dict[str, dict[str, float]]] = {}
        for key, value in record.items():
            parts = key.split("/")
            if len(parts) >= 2 and parts[-2] in ("bbox", "segm", "keypoints"):
                tasks = found.setdefault("/".join(parts[:-2]), {})
                tasks.setdefault(parts[-2], {})[parts[-1]] = float(value)
        if found:
            last = found
    return last


def _pick(run_dir: str, per_dataset: Mapping[str, dict], dataset: str | None) -> str:
    """The test set of ``per_dataset`` the run's row shows: ``dataset``, or its only one."""
    if dataset is None and len(per_dataset) > 1:
        raise ResultsError(
            f"{run_dir}: evaluated on several datasets {sorted(per_dataset)}; pick one with "
            "--dataset"
        )
    name = dataset or next(iter(per_dataset))
    if name not in per_dataset:
        raise ResultsError(f"{run_dir}: no results for dataset {name!r}")
    return name


def read_run(run_dir: str, label: str | None = None, dataset: str | None = None) -> RunResult:
    """The final metrics of ``run_dir`` (``results.json``, else ``metrics.json``)."""
    results_path = os.path.join(run_dir, RESULTS_FILE)
    if os.path.isfile(results_path):
        with open(results_path) as f:
            data = json.load(f)
        per_dataset = data["results"]
        if not per_dataset:
            raise ResultsError(f"{run_dir}: no evaluation ran (DATASETS.TEST was empty)")
        name = _pick(run_dir, per_dataset, dataset)
        # the label from the config's weights: an older file may record the weights' file name
        cfg = data.get("config") or {"MODEL": {"WEIGHTS": data.get("weights", "")}}
        pretraining = label or describe_run(cfg)[0]
        return RunResult(
            run_dir,
            pretraining,
            data["detector"],
            per_dataset[name],
            _weights_path(cfg),
            str(data.get("weights_sha256") or ""),
            name,
        )
    config_path, metrics_path = (os.path.join(run_dir, n) for n in ("config.yaml", "metrics.json"))
    if not (os.path.isfile(config_path) and os.path.isfile(metrics_path)):
        raise ResultsError(f"{run_dir}: neither {RESULTS_FILE} nor config.yaml + metrics.json")
    cfg = read_yaml(config_path, "run config", ResultsError)
    if not isinstance(cfg, dict):
        raise ResultsError(f"{config_path}: expected a YAML mapping of config keys")
    pretraining, detector = describe_run(cfg)
    per_dataset = _from_metrics_json(metrics_path)
    if not per_dataset:
        raise ResultsError(f"{run_dir}: metrics.json holds no evaluation results")
    if list(per_dataset) == [""]:  # one test set: its name is the config's
        tests = list((cfg.get("DATASETS") or {}).get("TEST") or [])
        per_dataset = {tests[0] if len(tests) == 1 else "": per_dataset[""]}
    name = _pick(run_dir, per_dataset, dataset)
    return RunResult(
        run_dir, label or pretraining, detector, per_dataset[name], _weights_path(cfg), "", name
    )


def build_table(runs: Sequence[RunResult]) -> tuple[list[str], list[list[float | None]]]:
    """Row labels (pretrainings, in order of appearance) and Table 4 values (``None``: no run)."""
    labels: list[str] = []
    cells: dict[tuple[str, str], RunResult] = {}
    first: dict[str, RunResult] = {}  # label -> its first run: the weights its row is keyed by
    # (label, annotations) -> its first run: the box and mask columns of a row read one test
    # set; the keypoint column reads the person-keypoint annotations, a test set of its own
    first_set: dict[tuple[str, bool], RunResult] = {}
    for run in runs:
        if run.pretraining not in labels:
            labels.append(run.pretraining)
        other = first.setdefault(run.pretraining, run)
        if not run.same_weights(other):
            raise ResultsError(
                f"{other.run_dir} and {run.run_dir} are both labelled {run.pretraining!r} but "
                f"started from different weights ({other.weights_name()} and "
                f"{run.weights_name()}); label them apart with LABEL=RUN_DIR"
            )
        same_set = first_set.setdefault((run.pretraining, run.detector == "keypoint_rcnn"), run)
        if run.dataset != same_set.dataset:
            other = same_set
            raise ResultsError(
                f"{other.run_dir} and {run.run_dir} are both labelled {run.pretraining!r} but "
                f"were evaluated on different test sets ({other.dataset or 'not recorded'} and "
                f"{run.dataset or 'not recorded'}), which one row would merge; label them apart "
                "with LABEL=RUN_DIR"
            )
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
    """Write ``PREFIX.md`` (one decimal, "–" where no run) and ``PREFIX.csv`` (three decimals,
    empty where no run); returns their paths."""
    labels, rows = build_table(runs)
    columns = ["pretraining", *TABLE_HEADER]
    md = [[label, *(_fmt(v, 1) for v in row)] for label, row in zip(labels, rows, strict=True)]
    csv_rows = [
        [label, *(_fmt(v, 3) for v in row)] for label, row in zip(labels, rows, strict=True)
    ]
    aligns = [None] + ["right"] * len(TABLE_HEADER)
    md_path = write_markdown(prefix + ".md", columns, md, align=aligns, missing="–")
    return md_path, write_csv(prefix + ".csv", columns, csv_rows)
