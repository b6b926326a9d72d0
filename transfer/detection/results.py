"""Collect finished fine-tuning runs into one table per protocol; COCO R50-FPN 1x is shaped like
the paper's Table 4.

A run directory holds the ``results.json`` of :func:`write_results` or, for a run that ended
before it, ``config.yaml`` and the last evaluation in ``metrics.json``. Each run belongs to a
protocol (:func:`run_protocol`: the evaluator, the backbone and the schedule, e.g. "COCO, Mask
R-CNN R50-C4, 2x"), whose table has that protocol's columns (:data:`PROTOCOL_COLUMNS`) and, below
the runs, the published reference rows with their sources (:mod:`.references`). Rows are
pretrainings (:func:`transfer.checkpoint.provenance.run_label` of the weights, ``random``
without, or ``LABEL=RUN_DIR``); the COCO R50-FPN 1x columns are AP, AP50, AP75 of Faster R-CNN
boxes, Mask R-CNN masks and Keypoint R-CNN keypoints (``tab:detection``); semantic segmentation
runs have a table per test set and head with mIoU, fwIoU, mACC and pACC. Runs under one label
from other weights (by sha256, else path) or on other test sets are refused, never merged into
one row.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.errors import ResultsError  # noqa: F401 (re-exported)
from pretrain.utils.yaml_files import read_yaml
from transfer.checkpoint.provenance import run_label
from transfer.metrics_json import read_metrics_json
from transfer.tables import markdown_table, write_csv

__all__ = [
    "PROTOCOL_COLUMNS",
    "RESULTS_FILE",
    "TABLE_COLUMNS",
    "TABLE_HEADER",
    "ProtocolTable",
    "ResultsError",
    "RunResult",
    "build_table",
    "build_tables",
    "describe_run",
    "run_protocol",
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

# evaluator_type -> its columns: (detector, None for any run; task; column title; metrics).
_COCO_TABLE5 = (  # MoCo's Table 5: box and mask of Mask R-CNN; the other detectors if run
    ("faster_rcnn", "bbox", "Faster R-CNN box", _METRICS),
    ("mask_rcnn", "bbox", "Mask R-CNN box", _METRICS),
    ("mask_rcnn", "segm", "Mask R-CNN mask", _METRICS),
    ("keypoint_rcnn", "keypoints", "Keypoint R-CNN keypoints", _METRICS),
)
PROTOCOL_COLUMNS: dict[str, tuple[tuple[str | None, str, str, tuple[str, ...]], ...]] = {
    "coco": _COCO_TABLE5,
    "pascal_voc": ((None, "bbox", "box", ("AP50", "AP", "AP75")),),
    "lvis": (
        (None, "bbox", "box", ("AP",)),
        (None, "segm", "mask", ("AP", "APr", "APc", "APf")),
    ),
    "cityscapes_instance": ((None, "segm", "mask", ("AP", "AP50")),),
    # SemSegEvaluator's summary (Cityscapes too, see .evaluation); per-class IoU-*/ACC-* stay
    # in results.json
    "sem_seg": ((None, "sem_seg", "", ("mIoU", "fwIoU", "mACC", "pACC")),),
}
# SEM_SEG_HEAD.NAME -> the model's name in a semantic table's title and a run's "detector"
_SEM_SEG_HEADS = {
    "SemSegFPNHead": ("Semantic FPN", "semantic_fpn"),
    "DeepLabV3PlusHead": ("DeepLabV3+", "deeplab_v3_plus"),
    "DeepLabV3PlusImagePoolHead": ("DeepLabV3+", "deeplab_v3_plus"),
    "DeepLabV3Head": ("DeepLabV3", "deeplab_v3"),
}
_TABLE4_COLUMNS = tuple((d, t, title, _METRICS) for d, t, title in TABLE_COLUMNS)
_KIND_TITLES = {
    "coco": "COCO",
    "pascal_voc": "Pascal VOC",
    "lvis": "LVIS",
    "cityscapes_instance": "Cityscapes instance segmentation",
    "sem_seg": "semantic segmentation",
}
_IMAGES_1X = 90000 * 16  # detectron2's 1x: 90k iterations of 16 images


@dataclass
class RunResult:
    """The final metrics of one run: ``metrics[task][metric]`` in percent (``None``: a
    per-class value of a class absent from the test set)."""

    run_dir: str
    pretraining: str
    detector: str
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    weights: str = ""  # MODEL.WEIGHTS, normalised ("": random initialisation)
    weights_sha256: str = ""  # of that file, when results.json recorded it
    dataset: str = ""  # the test set the metrics are of ("": not recorded)
    protocol: str = ""  # the title of the table it belongs to (run_protocol)
    kind: str = ""  # its evaluator's kind (run_protocol)

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


def _semantic_model(model: Mapping) -> tuple[str, str]:
    """``(title, detector)`` of a ``SemanticSegmentor``'s head (:data:`_SEM_SEG_HEADS`; another
    head: its registered name)."""
    head = str((model.get("SEM_SEG_HEAD") or {}).get("NAME", ""))
    return _SEM_SEG_HEADS.get(head, (head or "SemanticSegmentor", head or "semantic"))


def describe_run(cfg: Mapping) -> tuple[str, str]:
    """``(pretraining, detector)`` of a detectron2 config given as a CfgNode or plain dict; the
    "detector" of a semantic segmentation model names its head (``semantic_fpn``,
    ``deeplab_v3_plus``)."""
    model = cfg["MODEL"]
    weights = model.get("WEIGHTS", "")
    pretraining = run_label(weights) if weights else "random"
    if model.get("META_ARCHITECTURE", "GeneralizedRCNN") == "SemanticSegmentor":
        detector = _semantic_model(model)[1]
    elif model.get("META_ARCHITECTURE", "GeneralizedRCNN") != "GeneralizedRCNN":
        detector = str(model["META_ARCHITECTURE"])
    elif model.get("KEYPOINT_ON"):
        detector = "keypoint_rcnn"
    elif model.get("MASK_ON"):
        detector = "mask_rcnn"
    else:
        detector = "faster_rcnn"
    return pretraining, detector


def _schedule(cfg: Mapping, kind: str) -> str:
    """``1x``/``2x`` for COCO-style schedules (in images seen, so the CPU preset's 8x iterations
    at 2 images is 1x too), else ``<iterations> x <images>``."""
    solver = cfg.get("SOLVER") or {}
    max_iter, batch = int(solver.get("MAX_ITER", 0)), int(solver.get("IMS_PER_BATCH", 16))
    images = max_iter * batch
    if kind in ("coco", "lvis") and images and images % _IMAGES_1X == 0:
        return f"{images // _IMAGES_1X}x"
    its = f"{max_iter // 1000}k" if max_iter and max_iter % 1000 == 0 else str(max_iter)
    return f"{its} iterations of {batch}"


def _evaluator_kind(metrics: Mapping[str, Mapping], dataset: str) -> str:
    """The evaluator that wrote ``metrics`` (for results written without ``evaluator_type``)."""
    if "sem_seg" in metrics:
        return "sem_seg"
    if any("APr" in m for m in metrics.values()):
        return "lvis"
    if "segm" in metrics and "bbox" not in metrics:
        return "cityscapes_instance"
    if dataset.startswith("voc_") and set(metrics) == {"bbox"} and "APs" not in metrics["bbox"]:
        return "pascal_voc"
    return "coco"


def run_protocol(
    cfg: Mapping, metrics: Mapping[str, Mapping], dataset: str, evaluator_type: str = ""
) -> tuple[str, str]:
    """``(kind, title)`` of the table a run belongs to: the evaluator (``cityscapes_sem_seg``
    shares ``sem_seg``'s mIoU table), the model and the schedule, e.g. ``("coco", "COCO, R50-C4,
    2x")``; semantic tables are per test set and head (``"semantic segmentation,
    cityscapes_fine_sem_seg_val, DeepLabV3+ R50, 90k iterations of 8"``)."""
    kind = evaluator_type or _evaluator_kind(metrics, dataset)
    kind = "sem_seg" if kind == "cityscapes_sem_seg" else kind
    model = cfg.get("MODEL") or {}
    depth = (model.get("RESNETS") or {}).get("DEPTH", 50)
    if kind == "sem_seg":
        arch = f"{_semantic_model(model)[0]} R{depth}"
        return kind, f"{_KIND_TITLES[kind]}, {dataset}, {arch}, {_schedule(cfg, kind)}"
    c4 = str((model.get("ROI_HEADS") or {}).get("NAME", "")).startswith("Res5ROIHeads")
    arch = f"R{depth}-{'C4' if c4 else 'FPN'}"
    return kind, f"{_KIND_TITLES.get(kind, kind)}, {arch}, {_schedule(cfg, kind)}"


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
    output_dir: str,
    cfg: Mapping,
    results: Mapping,
    dataset_names: Sequence[str],
    evaluator_type: str = "",
) -> str:
    """Save ``DefaultTrainer.test``'s ``results`` (``{task: {metric: value}}`` for one test set,
    keyed by dataset for several, ``{}`` for none) as ``OUTPUT_DIR/results.json`` with the config,
    the weights and the test sets' ``evaluator_type`` that produced them; returns the path.
    A NaN (``SemSegEvaluator``'s IoU of a class absent from the test set and never predicted)
    is written as ``null``, so that the file stays standard JSON."""
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
            name: {task: {k: _finite_or_none(v) for k, v in m.items()} for task, m in tasks.items()}
            for name, tasks in per_dataset.items()
        },
        cfg,
        pretraining=pretraining,
        detector=detector,
        evaluator_type=evaluator_type,
        weights=cfg["MODEL"].get("WEIGHTS", ""),
        weights_sha256=_file_sha256(cfg["MODEL"].get("WEIGHTS", "")),
        max_iter=cfg["SOLVER"]["MAX_ITER"],
    )


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


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
            if len(parts) >= 2 and parts[-2] in ("bbox", "segm", "keypoints", "sem_seg"):
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
        metrics = per_dataset[name]
        return RunResult(
            run_dir,
            pretraining,
            data["detector"],
            metrics,
            _weights_path(cfg),
            str(data.get("weights_sha256") or ""),
            name,
            *reversed(run_protocol(cfg, metrics, name, str(data.get("evaluator_type") or ""))),
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
    metrics = per_dataset[name]
    kind, protocol = run_protocol(cfg, metrics, name)
    return RunResult(
        run_dir,
        label or pretraining,
        detector,
        metrics,
        _weights_path(cfg),
        "",
        name,
        protocol,
        kind,
    )


@dataclass
class ProtocolTable:
    """One protocol's table: value columns, then a row per pretraining and a row per published
    reference (``sources``: "" for runs)."""

    title: str
    columns: list[str]
    labels: list[str]
    rows: list[list[float | None]]
    sources: list[str]


def build_table(
    runs: Sequence[RunResult], columns: Sequence[tuple] = _TABLE4_COLUMNS
) -> tuple[list[str], list[list[float | None]]]:
    """Row labels (pretrainings, in order of appearance) and the values of ``columns``
    (``(detector or None for any run, task, title, metrics)``; default Table 4's), ``None``
    where no run has one."""
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
        for detector, task, _, metrics in columns:
            if detector is None:  # any run of the row that reports the task
                found = [r for (lb, _), r in cells.items() if lb == label and task in r.metrics]
                run = found[0] if found else None
            else:
                run = cells.get((label, detector))
            values = run.metrics.get(task, {}) if run else {}
            row += [values.get(m) for m in metrics]
        rows.append(row)
    return labels, rows


def _headers(columns: Sequence[tuple]) -> list[str]:
    return [f"{title} {m}".strip() for _, _, title, metrics in columns for m in metrics]


def build_tables(runs: Sequence[RunResult]) -> list[ProtocolTable]:
    """One :class:`ProtocolTable` per protocol of ``runs`` (in order of appearance), with the
    published references of :data:`~.references.PUBLISHED` below the runs. COCO R50-FPN 1x keeps
    Table 4's columns; other tables drop the column groups no row fills."""
    from .references import PUBLISHED

    groups: dict[str, list[RunResult]] = {}
    for run in runs:
        groups.setdefault(run.protocol, []).append(run)
    tables = []
    for title, group in groups.items():
        kind = group[0].kind or "coco"
        table4 = title.startswith(f"{_KIND_TITLES['coco']}, ") and title.endswith("-FPN, 1x")
        columns = list(_TABLE4_COLUMNS if table4 else PROTOCOL_COLUMNS[kind])
        labels, rows = build_table(group, columns)
        refs = PUBLISHED.get(title, [])
        if not table4:  # keep the groups that a run or a reference fills
            keep, at = [], 0
            for col in columns:
                width = len(col[3])
                names = _headers([col])
                filled = any(v is not None for row in rows for v in row[at : at + width])
                if filled or any(n in values for _, values, _ in refs for n in names):
                    keep.append((col, at, width))
                at += width
            columns = [col for col, _, _ in keep]
            rows = [[v for _, a, w in keep for v in row[a : a + w]] for row in rows]
        headers = _headers(columns)
        labels += [label for label, _, _ in refs]
        rows += [[values.get(h) for h in headers] for _, values, _ in refs]
        sources = [""] * len(_row_labels(group)) + [source for _, _, source in refs]
        tables.append(ProtocolTable(title, headers, labels, rows, sources))
    return tables


def _row_labels(runs: Sequence[RunResult]) -> list[str]:
    """The row labels of ``runs``, in order of appearance."""
    return list(dict.fromkeys(run.pretraining for run in runs))


def _fmt(value: float | None, digits: int) -> str:
    if value is None:
        return ""
    return "nan" if math.isnan(value) else f"{value:.{digits}f}"


def _slug(title: str) -> str:
    return "_".join("".join(c if c.isalnum() else " " for c in title.lower()).split())


def write_table(runs: Sequence[RunResult], prefix: str) -> tuple[str, str]:
    """Write ``PREFIX.md`` (one table per protocol under its title, one decimal, "–" where no
    run) and the CSV tables (three decimals, empty where no run): ``PREFIX.csv`` for a single
    protocol, else ``PREFIX_<protocol>.csv`` each; returns the Markdown path and the first CSV."""
    tables = build_tables(runs)
    sections, csv_paths = [], []
    for table in tables:
        with_sources = any(table.sources)
        columns = ["pretraining", *table.columns] + (["source"] if with_sources else [])
        md, csv_rows = [], []
        for label, row, source in zip(table.labels, table.rows, table.sources, strict=True):
            extra = [source] if with_sources else []
            md.append([label, *(_fmt(v, 1) for v in row), *extra])
            csv_rows.append([label, *(_fmt(v, 3) for v in row), *extra])
        aligns = [None] + ["right"] * len(table.columns) + ([None] if with_sources else [])
        csv_path = prefix + (".csv" if len(tables) == 1 else f"_{_slug(table.title)}.csv")
        csv_paths.append(write_csv(csv_path, columns, csv_rows))
        sections.append((table.title, columns, md, aligns))
    md_path = prefix + ".md"
    parts = []
    for title, columns, md, aligns in sections:
        table_md = markdown_table(columns, md, align=aligns, missing="–")
        parts.append(f"### {title}\n\n{table_md}")
    if os.path.dirname(md_path):
        os.makedirs(os.path.dirname(md_path), exist_ok=True)
    atomic_write_bytes(md_path, "\n".join(parts).encode())
    return md_path, csv_paths[0]
