"""The paper's experiments as data: each names its runs (a method table of configs and overrides,
and seeds), the evaluation every checkpoint gets and the page it produces: ``make study`` and its
sweeps on Fashion-MNIST (CPU), the ImageNet-100 ablations (Table 5, Fig. 3, 4b) and ImageNet-1K
(Table 1).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from transfer.analysis.study_setup import METHODS, SWEEP_BETAS, Method, StudyError, sweep_methods
from transfer.shipped_configs import config_path

__all__ = ["EXPERIMENTS", "Evaluation", "Experiment", "experiment_methods"]

_PRE = os.path.join(config_path(), "pretrain")
_EVAL = os.path.join(config_path(), "eval")


@dataclass(frozen=True)
class Evaluation:
    """What each checkpoint of an experiment gets: ``tool`` "study" (the study's own evaluation)
    or "linear_probe" with ``config`` (``config_by_method`` where a method needs another);
    ``later``: evaluations the paper reports that this tool does not run."""

    tool: str
    config: str = ""
    config_by_method: tuple[tuple[str, str], ...] = ()
    later: tuple[str, ...] = ()

    def config_for(self, method: str) -> str:
        return dict(self.config_by_method).get(method, self.config)


@dataclass(frozen=True)
class Experiment:
    name: str
    paper: str  # what it reproduces: "Table 5", "Fig. 3", ...
    # the method table and the page: "" (the three methods), "beta", "views" (the study's pages,
    # docs/results*.md when --results names them), or an ImageNet table (a linear top-1 page)
    sweep: str
    seeds: tuple[int, ...]
    evaluation: Evaluation
    cluster: bool  # ImageNet-scale: meant for --executor slurm
    # resources of one pretraining job at the paper's scale, for --executor slurm and the docs
    nodes: int = 1
    gpus_per_node: int = 0
    hours: float = 0.0  # estimated wall time of one pretraining run (docs/cluster.md, estimates)


_STUDY = Evaluation("study")
_IN100_PROBE = Evaluation(
    "linear_probe",
    os.path.join(_EVAL, "linear_lorac_in100.yaml"),
    (("mocov2", os.path.join(_EVAL, "linear_mocov2.yaml")),),
)
_IN1K_PROBE = Evaluation(
    "linear_probe",
    os.path.join(_EVAL, "linear_lorac_in1k.yaml"),
    (("mocov2", os.path.join(_EVAL, "linear_mocov2.yaml")),),
    later=(
        "12-dataset transfer: tools/transfer_linear.py (Table 2)",
        "COCO detection, segmentation, keypoints: tools/convert_to_d2.py + tools/train_net.py "
        "(Table 4)",
    ),
)

_IN100 = {"evaluation": _IN100_PROBE, "cluster": True, "nodes": 1, "gpus_per_node": 4}
EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment("study", "demo scale", "", (0, 1, 2, 3, 4), _STUDY, False),
        Experiment("study-beta", "Fig. 3, demo scale", "beta", (0, 1, 2), _STUDY, False),
        Experiment("study-views", "Fig. 4b, demo scale", "views", (0, 1, 2), _STUDY, False),
        Experiment("in100-priors", "Table 5", "in100-priors", (0, 1, 2), **_IN100, hours=2.0),
        Experiment("in100-beta", "Fig. 3", "in100-beta", (0, 1, 2), **_IN100, hours=2.0),
        Experiment("in100-views", "Fig. 4b", "in100-views", (0, 1, 2), **_IN100, hours=3.0),
        Experiment("in1k", "Table 1", "in1k", (0,), _IN1K_PROBE, True, 4, 8, hours=8.0),
    )
}

IN100_BETAS = (*SWEEP_BETAS, 16.0)  # Fig. 3: 0.5 ... 16, and MoCo-M (beta = inf)
IN100_VIEWS = (3, 4, 5, 6, 8)  # Fig. 4b (configs/pretrain/in100_r18_lorac_M*.yaml)


def _in100(name: str) -> str:
    return os.path.join(_PRE, f"in100_r18_{name}.yaml")


def _cluster_methods(table: str) -> dict[str, Method]:
    if table == "in100-priors":  # Table 5's columns
        return {
            "lorac": Method("LORAC", _in100("lorac_beta2")),
            "gaussian": Method("Gauss.", _in100("gaussian")),
            "lorac_bs": Method("LORAC-bs", _in100("lorac_bs")),
            "lsftmx_c3": Method("L-sftmx-c", _in100("lsftmx_c3")),
            "mocom": Method("MoCo-M", _in100("mocom")),
            "mocov2": Method("MoCo-v2", _in100("mocov2")),
        }
    if table == "in100-beta":
        out = {f"lorac_beta{b:g}": Method(f"LORAC β={b:g}", _in100(f"lorac_beta{b:g}"), (), b)
               for b in IN100_BETAS}  # fmt: skip
        out["mocom"] = Method("MoCo-M (β=∞)", _in100("mocom"), (), math.inf)
        return out
    if table == "in100-views":  # M x 224 views, beta = 1; MoCo-M at the same views
        out = {}
        for m in IN100_VIEWS:
            out[f"lorac_M{m}"] = Method(f"LORAC M={m}", _in100(f"lorac_M{m}"), (), m)
            out[f"mocom_M{m}"] = Method(
                f"MoCo-M M={m}", _in100(f"lorac_M{m}"), ("LOSS.PRIOR", "none"), m
            )
        return out
    if table == "in1k":
        return {
            k: Method(label, os.path.join(_PRE, f"in1k_r50_{k}_200ep.yaml"))
            for k, label in (("lorac", "LORAC"), ("mocom", "MoCo-M"), ("mocov2", "MoCo-v2"))
        }
    raise StudyError(f"no method table {table!r}")


def experiment_methods(exp: Experiment, epochs: float) -> dict[str, Method]:
    """The experiment's method table (a sweep's warm-up is half of ``epochs``)."""
    if not exp.sweep:
        return dict(METHODS)
    if not exp.cluster:
        return sweep_methods(exp.sweep, epochs)
    return _cluster_methods(exp.sweep)
