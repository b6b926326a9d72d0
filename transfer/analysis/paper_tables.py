"""The paper's Tables 1-5, transcribed from its LaTeX source, numbered in the order of its
``table`` environments (labels cited per table). Table 5's models are rows here, as in every
other table; ``None`` is a value the paper does not report ("/"); ``marks`` keep its footnote
symbols (``#`` borrowed from Kolesnikov et al. 2019, ``§`` the authors' re-implementations).
Column names are those of the evaluation tools' CSV files, so a tool's row lines up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["PAPER_TABLES", "PaperRow", "PaperTable", "normalize_name"]


@dataclass(frozen=True)
class PaperRow:
    name: str
    values: dict[str, float | str | None]
    marks: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PaperTable:
    key: str
    number: int
    latex_label: str
    title: str
    key_column: str  # the model-name column of the tool's CSV
    info_columns: tuple[str, ...]  # descriptive columns (Table 1's setup columns)
    metric_columns: tuple[str, ...]  # numeric columns compared with this run's
    rows: tuple[PaperRow, ...]
    # Rows that always get a "this run" line (saying "not run" when nothing was found).
    main_rows: tuple[str, ...] = ("LORAC", "MoCo-M", "MoCo-v2")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.info_columns + self.metric_columns

    def row(self, name: str) -> PaperRow | None:
        key = normalize_name(name)
        return next((r for r in self.rows if normalize_name(r.name) == key), None)


def normalize_name(name: str) -> str:
    """Case and punctuation-free model name: "MoCo-M", "moco_m" and "MOCO M" all match."""
    return "".join(c for c in name.lower() if c.isalnum())


def _rows(columns: tuple[str, ...], table: list[tuple]) -> tuple[PaperRow, ...]:
    """``(name, v1, v2, ...)`` tuples -> rows; a value ``(x, "#")`` carries a footnote mark."""
    rows = []
    for name, *cells in table:
        if len(cells) != len(columns):
            raise ValueError(f"paper row {name!r}: {len(cells)} values for {len(columns)} columns")
        values, marks = {}, {}
        for col, cell in zip(columns, cells, strict=True):
            if isinstance(cell, tuple):
                cell, marks[col] = cell
            values[col] = cell
        rows.append(PaperRow(name, values, marks))
    return tuple(rows)


_T1_INFO = ("batchsize", "train. epoch", "multi-crop", "num. forward", "arch.", "pars. (M)")
_T1_METRIC = ("Top-1", "Top-5")
_R50 = "ResNet-50"
_MC = "3x224 + 5x96"
_MC6 = "2x224 + 6x96"
TABLE1 = PaperTable(
    "table1",
    1,
    "tab:imagenet_main",
    "Linear classification on ImageNet-1K frozen features",
    "Method",
    _T1_INFO,
    _T1_METRIC,
    _rows(
        _T1_INFO + _T1_METRIC,
        [
            ("Jigsaw", "256", "69", "/", "1", "ResNet-50(2x)", "94", (44.6, "#"), (68.0, "#")),
            ("Rotation", "192", "30", "/", "1", "RevNet(4x)", "86", (55.4, "#"), (77.9, "#")),
            ("DeepCluster", "256", "500", "/", "1", "VGG", "15", 48.4, None),
            ("BigBiGAN", "2048", "1569", "/", "1", "RevNet(4x)", "86", 61.3, 81.9),
            ("CPC-v1", "512", "200", "/", "1", "ResNet-101", "28", 48.7, 73.6),
            ("CPC-v2", "512", "200", "/", "1", _R50, "24", 63.8, 85.3),
            ("CMC", "128", "200", "2", "2", _R50, "47", 64.0, 85.5),
            ("SimCLR", "4096", "1000", "2x224", "2", _R50, "24", 69.3, 89.0),
            ("JCL", "256", "200", "5x224", "5", _R50, "24", 68.7, 89.0),
            ("MoCo-v1", "256", "200", "2x224", "2", _R50, "24", 60.6, (83.1, "§")),
            ("MoCo-v2", "256", "200", "2x224", "2", _R50, "24", (67.5, "§"), (88.0, "§")),
            ("MoCo-v2+", "256", "800", "2x224", "4", _R50, "24", (72.2, "§"), None),
            ("BYOL", "4096", "400", "2x224", "4", _R50, "24", 73.2, None),
            ("Barlow Twins", "2048", "1000", "2x224", "2", _R50, "24", 73.2, 91.0),
            ("SwAV (2x224 + 6x96)", "256", "200", _MC6, "10", _R50, "24", (72.7, "§"), (91.5, "§")),
            ("SwAV (3x224 + 5x96)", "256", "200", _MC, "10", _R50, "24", (72.3, "§"), (91.1, "§")),
            ("MoCo-M", "256", "200", _MC, "10", _R50, "24", 72.5, 91.3),
            ("LORAC", "256", "200", _MC, "10", _R50, "24", 73.2, 91.6),
        ],
    ),
)

_T2 = (
    "Aircraft",
    "Birdsnap",
    "Caltech-101",
    "Cars",
    "CIFAR10",
    "CIFAR100",
    "DTD",
    "Flowers",
    "Food",
    "Pets",
    "Place365",
    "SUN397",
    "Average",
)
# Table 2's rows, one per model, in the paper's column order
_T2_ROWS = [
    ("Supervised", 42.6, 57.2, 90.9, 62.8, 90.0, 73.4, 68.8, 89.7, 71.3, 92.4, 49.1, 60.3, 70.7),
    ("MoCo-v1", 34.2, 32.2, 77.5, 40.5, 82.3, 60.2, 64.5, 80.8, 67.5, 73.9, 45.7, 52.2, 59.3),
    ("MoCo-v2", 39.3, 40.7, 88.6, 52.9, 89.8, 71.0, 69.2, 87.4, 72.5, 82.9, 48.7, 59.2, 66.9),
    ("SwAV", 45.5, 49.0, 98.0, 62.2, 90.8, 73.5, 72.2, 88.9, 74.3, 87.1, 51.4, 64.4, 71.4),
    ("MoCo-M", 44.5, 49.3, 98.0, 60.5, 91.4, 74.0, 72.6, 88.9, 73.7, 86.4, 51.2, 64.1, 71.2),
    ("LORAC", 47.8, 50.9, 98.1, 63.5, 91.8, 75.3, 72.7, 89.5, 76.0, 86.8, 51.9, 64.9, 72.4),
]
TABLE2 = PaperTable(
    "table2",
    2,
    "tab:12datasetsemi",
    "Linear classification on other tasks",
    "Model",
    (),
    _T2,
    _rows(_T2, _T2_ROWS),
)

_T3 = ("1% Top-1", "1% Top-5", "10% Top-1", "10% Top-5")
TABLE3 = PaperTable(
    "table3",
    3,
    "tab:semi",
    "Semi-supervised learning (ImageNet-1K, 1% and 10% labels)",
    "Model",
    (),
    _T3,
    _rows(
        _T3,
        [
            ("MoCo-v1", 29.8, 55.9, 49.2, 75.2),
            ("MoCo-v2", 44.0, 70.9, 58.8, 82.8),
            ("SwAV", 49.6, 76.1, 67.7, 88.7),
            ("MoCo-M", 48.4, 75.4, 66.9, 88.5),
            ("LORAC", 50.0, 76.3, 68.0, 88.9),
        ],
    ),
)

_T4 = tuple(
    f"{task} {m}"
    for task in ("Faster R-CNN box", "Mask R-CNN mask", "Keypoint R-CNN keypoints")
    for m in ("AP", "AP50", "AP75")
)
TABLE4 = PaperTable(
    "table4",
    4,
    "tab:detection",
    "COCO detection, instance segmentation and keypoints (R-50 FPN, 1x)",
    "pretraining",
    (),
    _T4,
    _rows(
        _T4,
        [
            ("random", 30.1, 48.6, 31.9, 28.5, 46.8, 30.4, 63.5, 85.3, 69.3),
            ("supervised", 38.2, 59.1, 41.5, 35.4, 56.5, 38.1, 65.4, 87.0, 71.0),
            ("MoCo-v1", 37.1, 57.4, 40.2, 35.1, 55.9, 37.7, 65.6, 87.1, 71.3),
            ("MoCo-v2", 37.6, 57.9, 40.8, 35.3, 55.9, 37.9, 66.0, 87.2, 71.4),
            ("SwAV", 38.5, 60.5, 41.4, 36.3, 57.7, 38.9, 65.4, 86.7, 71.2),
            ("MoCo-M", 39.3, 61.1, 42.5, 36.8, 58.4, 39.4, 66.1, 87.3, 72.4),
            ("LORAC", 39.5, 61.1, 43.1, 37.1, 58.5, 40.2, 66.6, 87.5, 72.7),
        ],
    ),
    main_rows=("LORAC", "MoCo-M", "MoCo-v2", "supervised", "random"),
)

TABLE5 = PaperTable(
    "table5",
    5,
    "tab:epochsHq",
    "Priors h(Q) on ImageNet-100 (ResNet-18, 100 epochs, linear classification)",
    "Method",
    (),
    _T1_METRIC,
    _rows(
        _T1_METRIC,
        [
            ("LORAC", 78.7, 94.8),
            ("Gauss.", 78.8, 94.9),
            ("LORAC-bs", 78.6, 94.6),
            ("L-sftmx-c", 76.8, 94.2),
            ("MoCo-M", 77.0, 94.3),
            ("MoCo-v2", 65.3, 88.3),
        ],
    ),
)

PAPER_TABLES: dict[str, PaperTable] = {t.key: t for t in (TABLE1, TABLE2, TABLE3, TABLE4, TABLE5)}
