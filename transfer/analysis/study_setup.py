"""What a study is: its methods (the three of ``make study``, the tables of its two sweeps) and
options; below both the driver (:mod:`transfer.study`) and the pages that show its records.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pretrain.utils.errors import LoracError
from transfer.shipped_configs import config_path

__all__ = [
    "METHODS",
    "SWEEPS",
    "Method",
    "StudyError",
    "StudyOptions",
    "sweep_methods",
]

_CONFIGS = config_path()


class StudyError(LoracError):
    """An invalid study set-up; the message names the option, file or key and the value."""


@dataclass(frozen=True)
class Method:
    label: str  # as in the tables: LORAC, MoCo-M, MoCo-v2
    config: str  # pretraining config (inherits the demo config)
    opts: tuple = ()  # this method's own overrides KEY VALUE ..., after the study's
    x: float | None = None  # its place on a sweep's axis (beta, or the number of views M)


METHODS: dict[str, Method] = {
    "lorac": Method("LORAC", os.path.join(_CONFIGS, "pretrain", "demo_fashion_mnist_r18.yaml")),
    "mocom": Method(
        "MoCo-M", os.path.join(_CONFIGS, "pretrain", "demo_fashion_mnist_r18_mocom.yaml")
    ),
    "mocov2": Method(
        "MoCo-v2", os.path.join(_CONFIGS, "pretrain", "demo_fashion_mnist_r18_mocov2.yaml")
    ),
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
        return {
            "knn_train": self.knn_train,
            "knn_test": self.knn_test,
            "nuclear_images": self.nuclear_images,
            "nuclear_views": self.nuclear_views,
            "nuclear_seed": self.nuclear_seed,
            "probe_epochs": self.probe_epochs,
            "probe_lr_range": list(self.probe_lr_range),
            "probe_num_lrs": self.probe_num_lrs,
            "probe_heldout_per_class": self.probe_heldout_per_class,
        }
