"""What a study is: its methods (the three of ``make study``, the tables of its two sweeps and of
the ImageNet experiments) and options, and the paper's experiments as data. Each experiment names
its runs (a method table of configs and overrides, and seeds), the evaluation every checkpoint
gets and the page it produces: ``make study`` and its sweeps on Fashion-MNIST (CPU), the
ImageNet-100 ablations (Table 5, Fig. 3, 4b) and ImageNet-1K (Table 1).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pretrain.utils.errors import LoracError
from transfer.shipped_configs import config_path

__all__ = [
    "EXPERIMENTS",
    "METHODS",
    "SWEEPS",
    "Evaluation",
    "Experiment",
    "Method",
    "StudyError",
    "StudyOptions",
    "experiment_methods",
    "sweep_methods",
]

_PRE = os.path.join(config_path(), "pretrain")


class StudyError(LoracError):
    """An invalid study set-up; the message names the option, file or key and the value."""


@dataclass(frozen=True)
class Method:
    label: str  # as in the tables: LORAC, MoCo-M, MoCo-v2
    config: str  # pretraining config (inherits the demo config)
    opts: tuple = ()  # this method's own overrides KEY VALUE ..., after the study's
    x: float | None = None  # its place on a sweep's axis (beta, or the number of views M)


METHODS: dict[str, Method] = {
    "lorac": Method("LORAC", os.path.join(_PRE, "demo_fashion_mnist_r18.yaml")),
    "mocom": Method("MoCo-M", os.path.join(_PRE, "demo_fashion_mnist_r18_mocom.yaml")),
    "mocov2": Method("MoCo-v2", os.path.join(_PRE, "demo_fashion_mnist_r18_mocov2.yaml")),
}
# The paper's two ablations at demo scale (Sec. 6.2), beta = inf for the first half of the epochs
# as its ImageNet-100 runs: Fig. 3 (beta) and Fig. 4b (M views of one size, one key crop, beta 1).
SWEEP_BETAS = (0.5, 1.0, 2.0, 4.0, 8.0)
SWEEP_VIEWS = (2, 3, 4, 6)
SWEEPS = ("beta", "views")


def sweep_methods(sweep: str, epochs: float) -> dict[str, Method]:
    """The method table of ``sweep`` ("beta" or "views") at ``epochs`` epochs."""
    lorac, mocom = METHODS["lorac"].config, METHODS["mocom"].config
    half = ("LOSS.BETA_INF_EPOCHS", epochs / 2)
    if sweep == "beta":
        table = {
            f"lorac_beta{b:g}": Method(f"LORAC β={b:g}", lorac, ("LOSS.BETA", b, *half), b)
            for b in SWEEP_BETAS
        }
        table["mocom"] = Method("MoCo-M (β=∞)", mocom, (), math.inf)
        return table
    if sweep == "views":
        table = {}
        for m in SWEEP_VIEWS:
            views = ("INPUT.LARGE_CROPS", m, "INPUT.SMALL_CROPS", 0, "INPUT.KEY_CROPS", 1)
            views += ("LOSS.LOWRANK_VIEWS", "queries")
            table[f"lorac_M{m}"] = Method(
                f"LORAC M={m}", lorac, (*views, "LOSS.BETA", 1.0, *half), m
            )
            table[f"mocom_M{m}"] = Method(f"MoCo-M M={m}", mocom, views, m)
        return table
    raise StudyError(f"--sweep {sweep!r}: choose from {SWEEPS}")


@dataclass
class StudyOptions:
    output_dir: str = "output/study"
    results: str = "docs/results.md"
    seeds: Sequence[int] = (0, 1, 2, 3, 4)
    methods: Sequence[str] = tuple(METHODS)
    knn_train: int = 10000  # kNN reference images (Fashion-MNIST train split)
    knn_test: int = 10000  # kNN test images
    nuclear_images: int = 500  # test images of the ||Q_hat||_* statistic, spread over the split
    nuclear_views: int = 32  # augmented views per image (paper: 32)
    nuclear_seed: int = 0  # the views' seed: the same views for every model
    # Linear probe on the kNN's frozen features (transfer.study.run.linear_probe)
    probe_epochs: int = 30
    # pooled ResNet features are not normalised: a (0.01, 10) sweep chose its lowest lr for LORAC
    probe_lr_range: tuple[float, float] = (1e-4, 1.0)
    probe_num_lrs: int = 7
    probe_heldout_per_class: int = 100
    jobs: int = 1  # runs at once, each in its own process with nproc // jobs threads
    opts: Sequence[str] = ()  # pretraining overrides KEY VALUE ..., applied to every method
    command: str = ""  # the command line, for the report
    sweep: str = ""  # "" (the three methods), "beta" or "views": see sweep_methods
    # A folder (committed with the results) where each finished run's study.json is also kept;
    # a run whose record is there is not run again, even without its run directory.
    records: str = ""
    method_table: Mapping[str, Method] = field(default_factory=lambda: dict(METHODS))

    def overrides(self, method: str) -> list[str]:
        """The config overrides of ``method``'s runs: the study's, then the method's own."""
        return [str(o) for o in (*self.opts, *self.method_table[method].opts)]

    def eval_settings(self) -> dict[str, object]:
        """What a study.json's numbers depend on besides the checkpoint (compared on resume)."""
        return {k: list(v) if isinstance(v := getattr(self, k), tuple) else v for k in _EVAL_KEYS}


# the options of :meth:`StudyOptions.eval_settings`
_EVAL_KEYS = ("knn_train", "knn_test", "nuclear_images", "nuclear_views", "nuclear_seed")
_EVAL_KEYS += ("probe_epochs", "probe_lr_range", "probe_num_lrs", "probe_heldout_per_class")

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
_MOCOV2_PROBE = (("mocov2", os.path.join(_EVAL, "linear_mocov2.yaml")),)
_IN100_PROBE = Evaluation(
    "linear_probe", os.path.join(_EVAL, "linear_lorac_in100.yaml"), _MOCOV2_PROBE
)
_IN1K_PROBE = Evaluation(
    "linear_probe",
    os.path.join(_EVAL, "linear_lorac_in1k.yaml"),
    _MOCOV2_PROBE,
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
