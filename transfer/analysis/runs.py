"""Read pretraining run directories: ``metrics.json`` (:func:`transfer.metrics_json.
read_metrics_json`) and ``config.yaml``; a missing file is listed as a note of the run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pretrain.utils.run_owner import KINDS, PRETRAINING, owner_of
from pretrain.utils.yaml_files import read_yaml
from transfer.analysis import AnalysisError
from transfer.metrics_json import read_metrics_json

__all__ = [
    "CURVES",
    "Curve",
    "RunData",
    "beta_label",
    "load_run",
    "parse_run_spec",
    "prior_never_on",
]


@dataclass(frozen=True)
class Curve:
    key: str  # the metrics.json key
    title: str
    ylabel: str
    scale: float = 1.0  # e.g. 100 for fractions shown in %
    zero_is_missing: bool = False


# One figure per metric, in this order. A nuclear_norm of 0 means "not logged" (the norm of unit
# rows is >= 1).
CURVES = (
    Curve("total_loss", "Training loss", "loss"),
    Curve("nuclear_norm", "Mean ||Q||_* of the batch", "mean ||Q||_*", zero_is_missing=True),
    Curve("inst_acc", "Instance-discrimination accuracy", "accuracy (%)", scale=100.0),
    Curve("knn/top1", "kNN top-1 accuracy (monitor)", "top-1 (%)", scale=100.0),
    Curve("knn/effective_rank", "Effective rank of the monitor's features", "effective rank"),
    Curve("knn/std_ratio", "Per-dimension std of the monitor's features", "std x sqrt(d)"),
    Curve("knn/alignment", "Class alignment of the monitor's features", "alignment"),
    Curve("knn/uniformity", "Uniformity of the monitor's features", "uniformity"),
    Curve("lr", "Learning rate", "lr"),
    Curve("beta", "Prior beta", "beta"),
    Curve("images_per_sec", "Throughput", "images / s"),
)


def prior_never_on(config: Mapping, betas: Sequence[float] = ()) -> bool:
    """Whether a run with a prior trained with beta = inf throughout (MoCo-M in all but name):
    its ``LOSS.BETA`` or every beta it logged is inf, or, with none logged, its ``SOLVER.EPOCHS``
    end by ``LOSS.BETA_INF_EPOCHS``. False without a prior or a config that says."""
    loss, solver = config.get("LOSS") or {}, config.get("SOLVER") or {}
    if loss.get("PRIOR") in (None, "none"):
        return False
    try:
        beta = float(loss.get("BETA", 0.0))
    except (TypeError, ValueError):  # not a number: RunData.beta names it
        beta = 0.0
    if math.isinf(beta):
        return True
    if betas:
        return all(math.isinf(b) for b in betas)
    epochs = float(solver.get("EPOCHS") or math.inf)
    return not solver.get("MAX_ITER") and float(loss.get("BETA_INF_EPOCHS") or 0.0) >= epochs


def beta_label(beta: float, never_on: bool) -> str:
    """A run's beta as the tables show it (``inf``: no prior); for a prior that never turned on,
    the beta it trained with (inf), then the one it was configured with."""
    text = "inf" if math.isinf(beta) else f"{beta:g}"
    return f"inf (prior never on; LOSS.BETA {text})" if never_on else text


@dataclass
class RunData:
    label: str
    directory: str
    records: list[dict] = field(default_factory=list)  # one per iteration, sorted
    config: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def series(self, key: str) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for r in self.records:
            if key in r and isinstance(r[key], (int, float)):
                xs.append(float(r["iteration"]))
                ys.append(float(r[key]))
        return xs, ys

    def last(self, key: str, skip_zero: bool = False) -> float | None:
        _, ys = self.series(key)
        ys = [y for y in ys if not (skip_zero and y == 0.0)]
        return ys[-1] if ys else None

    def cfg(self, dotted: str, default: Any = None) -> Any:
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def beta(self) -> float | None:
        """The prior's final beta from config.yaml (inf with prior "none"), None if unknown."""
        if self.cfg("LOSS.PRIOR") == "none":
            return math.inf
        beta = self.cfg("LOSS.BETA")
        try:
            return float(beta) if beta is not None else None
        except (TypeError, ValueError):
            raise AnalysisError(f"{self.directory}/config.yaml: LOSS.BETA {beta!r}") from None

    @property
    def prior_never_on(self) -> bool:
        """:func:`prior_never_on` of this run's config and logged betas."""
        return prior_never_on(self.config, self.series("beta")[1])


def parse_run_spec(spec: str) -> tuple[str, str]:
    """``LABEL=DIR`` or ``DIR`` -> ``(label, dir)``; the label defaults to the folder name."""
    label, sep, path = spec.partition("=")
    if not sep or os.path.isdir(spec):
        path, label = spec, os.path.basename(os.path.abspath(spec).rstrip(os.sep))
    return label, path


def load_run(spec: str) -> RunData:
    label, path = parse_run_spec(spec)
    if not os.path.isdir(path):
        raise AnalysisError(f"{path}: run directory not found")
    owner = owner_of(path)
    if owner not in (None, PRETRAINING):
        kind = KINDS[owner]
        raise AnalysisError(
            f"{path} holds {kind.what} ({kind.tool}), not a pretraining run: RUN_DIR is a "
            "pretraining OUTPUT_DIR (an evaluation's tables go to --eval-dir, a detection run "
            "to --detection-dir)"
        )
    run = RunData(label, path)
    metrics = os.path.join(path, "metrics.json")
    if os.path.isfile(metrics):
        run.records = read_metrics_json(metrics)
        if not run.records:
            run.notes.append("metrics.json is empty")
    else:
        run.notes.append("no metrics.json (not started?)")
    config = os.path.join(path, "config.yaml")
    if os.path.isfile(config):
        loaded = read_yaml(config, "run config", AnalysisError)
        if not isinstance(loaded, dict):
            raise AnalysisError(f"{config}: expected a mapping of config keys")
        run.config = loaded
    else:
        run.notes.append("no config.yaml")
    return run
