"""The checks made before a study runs: every method's pretraining config loads, with the study's
overrides, on Fashion-MNIST, at equal training lengths.
"""

from __future__ import annotations

import os

from fvcore.common.config import CfgNode

from pretrain.config.defaults import load_config

from .experiments import Experiment, StudyError, StudyOptions

__all__ = [
    "FASHION_MNIST_CLASSES",
    "load_experiment_configs",
    "load_method_configs",
    "prior_never_on",
    "prior_on_iter",
]

FASHION_MNIST_CLASSES = 10


def _check_runs(opt: StudyOptions) -> None:
    """Known methods, one or more distinct seeds."""
    unknown = [m for m in opt.methods if m not in opt.method_table]
    if unknown or not opt.methods:
        raise StudyError(
            f"--methods {' '.join(opt.methods) or '(none)'}: choose from {list(opt.method_table)}"
        )
    if not opt.seeds or len(set(opt.seeds)) != len(opt.seeds):
        raise StudyError(f"--seeds {list(opt.seeds)}: give one or more distinct seeds")


def load_method_configs(opt: StudyOptions) -> dict[str, CfgNode]:
    """``{method key: config with the overrides}`` (seed and output directory not yet set);
    :class:`StudyError` for bad options, a non-Fashion-MNIST dataset or unequal lengths."""
    _check_runs(opt)
    for k in ("knn_train", "knn_test", "nuclear_images", "probe_epochs", "probe_num_lrs", "jobs"):
        if getattr(opt, k) < 1:
            raise StudyError(f"--{k.replace('_', '-')} {getattr(opt, k)}: must be >= 1")
    held = opt.probe_heldout_per_class * FASHION_MNIST_CLASSES
    if opt.knn_train <= held:
        # every reference image would be held out to choose the lr: 0 iterations to train on
        raise StudyError(
            f"--knn-train {opt.knn_train}: the linear probe chooses its lr on "
            f"{opt.probe_heldout_per_class} held-out reference images per class "
            f"({held} in all), which leaves none to train it on; give --knn-train > {held}"
        )
    cfgs = _load(opt)
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


def prior_on_iter(cfg: CfgNode, images: int) -> int | None:
    """The iteration at which a run of ``cfg`` on ``images`` training images turns its prior on
    (``LOSS.BETA_INF_EPOCHS``); None for a method without a prior."""
    from pretrain.engine.trainer import schedule_lengths

    if cfg.LOSS.PRIOR == "none":
        return None
    return schedule_lengths(cfg, images)[2]


def prior_never_on(opt: StudyOptions, cfgs: dict[str, CfgNode]) -> str:
    """A one-line warning when a method with a prior stops training before the prior turns on
    (as with ``SOLVER.MAX_ITER 20``): such a run is MoCo-M under another name; "" otherwise."""
    from pretrain.data.datasets import build_source
    from pretrain.engine.trainer import schedule_lengths
    from pretrain.utils.errors import ConfigError

    late, ends, sizes = [], set(), {}
    for m, cfg in cfgs.items():
        if cfg.LOSS.PRIOR == "none" or cfg.LOSS.BETA_INF_EPOCHS <= 0:
            continue
        where = (cfg.DATASETS.TYPE, cfg.DATASETS.ROOT)
        if where not in sizes:
            sizes[where] = len(build_source(cfg, "train"))
        try:
            _, max_iter, on = schedule_lengths(cfg, sizes[where])
        except ConfigError:  # a batch larger than the data: the run itself says so
            continue
        if on >= max_iter:
            late.append(f"{opt.method_table[m].label} at iteration {on}")
            ends.add(max_iter)
    if not late:
        return ""
    return (
        f"training ends at iteration {', '.join(map(str, sorted(ends)))} (SOLVER.MAX_ITER / "
        f"SOLVER.EPOCHS), before the prior turns on ({', '.join(late)}, LOSS.BETA_INF_EPOCHS): "
        "those runs train with beta = inf throughout and equal MoCo-M"
    )


def load_experiment_configs(exp: Experiment, opt: StudyOptions) -> dict[str, CfgNode]:
    """The configs of an experiment's methods: the study's checks for the CPU experiments; an
    ImageNet experiment's data may live on the cluster only, so its root is not looked at."""
    if not exp.cluster:
        return load_method_configs(opt)
    _check_runs(opt)
    return _load(opt)


def _load(opt: StudyOptions) -> dict[str, CfgNode]:
    return {m: load_config(opt.method_table[m].config, opt.overrides(m)) for m in opt.methods}
