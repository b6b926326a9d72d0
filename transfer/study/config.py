"""The checks made before a study runs: every method's pretraining config loads, with the study's
overrides, on Fashion-MNIST, at equal training lengths.

What a study is (its methods, sweeps and options) is shared with the pages that show its
records, so it lives below both, in :mod:`transfer.analysis.study_setup`.
"""

from __future__ import annotations

import os

from fvcore.common.config import CfgNode

from pretrain.config.defaults import load_config
from transfer.analysis.study_setup import StudyError, StudyOptions

__all__ = ["load_method_configs"]


def load_method_configs(opt: StudyOptions) -> dict[str, CfgNode]:
    """``{method key: config with the overrides}`` (seed and output directory not yet set).

    Raises :class:`StudyError` for an unknown method, no seeds, a non-Fashion-MNIST dataset, a
    missing dataset root, or methods whose training lengths differ (the study compares methods
    at equal epochs).
    """
    unknown = [m for m in opt.methods if m not in opt.method_table]
    if unknown or not opt.methods:
        raise StudyError(
            f"--methods {' '.join(opt.methods) or '(none)'}: choose from {list(opt.method_table)}"
        )
    if not opt.seeds or len(set(opt.seeds)) != len(opt.seeds):
        raise StudyError(f"--seeds {list(opt.seeds)}: give one or more distinct seeds")
    for name in (
        "knn_train",
        "knn_test",
        "nuclear_images",
        "probe_epochs",
        "probe_num_lrs",
        "jobs",
    ):
        if getattr(opt, name) < 1:
            raise StudyError(f"--{name.replace('_', '-')} {getattr(opt, name)}: must be >= 1")
    cfgs = {
        m: load_config(
            opt.method_table[m].config,
            [str(o) for o in (*opt.opts, *opt.method_table[m].opts)],
        )
        for m in opt.methods
    }
    for m, cfg in cfgs.items():
        where = f"{opt.method_table[m].config} (method {m})"
        if cfg.DATASETS.TYPE != "fashion_mnist":
            raise StudyError(
                f"{where}: DATASETS.TYPE = {cfg.DATASETS.TYPE!r}: the study evaluates on "
                "Fashion-MNIST's test split; it needs 'fashion_mnist'"
            )
        if not os.path.isdir(cfg.DATASETS.ROOT):
            raise StudyError(
                f"{where}: DATASETS.ROOT = {cfg.DATASETS.ROOT!r} is not a directory (install "
                "Debian's dataset-fashion-mnist or override DATASETS.ROOT)"
            )
    lengths = {m: (float(c.SOLVER.EPOCHS), int(c.SOLVER.MAX_ITER)) for m, c in cfgs.items()}
    if len(set(lengths.values())) > 1:
        listed = ", ".join(f"{m}: EPOCHS {e:g}, MAX_ITER {i}" for m, (e, i) in lengths.items())
        raise StudyError(
            f"SOLVER.EPOCHS / SOLVER.MAX_ITER differ between the methods' configs ({listed}); "
            "the study compares methods at equal epochs"
        )
    return cfgs
