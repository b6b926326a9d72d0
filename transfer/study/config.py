"""The checks made before a study runs: every method's pretraining config loads, with the study's
overrides, on Fashion-MNIST, at equal training lengths.
"""

from __future__ import annotations

import os

from fvcore.common.config import CfgNode

from pretrain.config.defaults import load_config
from transfer.analysis.study_setup import StudyError, StudyOptions

from .experiments import Experiment

__all__ = [
    "FASHION_MNIST_CLASSES",
    "check_same_settings",
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


def _pairs(overrides: object) -> dict[str, str]:
    items = [str(o) for o in overrides] if isinstance(overrides, list) else []
    return dict(zip(items[::2], items[1::2], strict=False))


def _differences(old: dict, new: dict) -> list[str]:
    """``KEY old (now new)`` for each key whose value differs between ``old`` and ``new``."""
    return [
        f"{k} {old.get(k, '(not set)')} (now {new.get(k, 'not set')})"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    ]


def _run_differences(opt: StudyOptions, cfgs: dict[str, CfgNode], method: str, seed: int) -> list:
    """How the run ``(method, seed)`` already in ``opt.output_dir`` (or ``opt.records``) was made
    differently from what ``opt`` asks: its overrides and evaluation settings (a finished run's
    study.json or record), or its config (an unfinished run's config.yaml)."""
    from pretrain.config.resume import RESUME_MAY_CHANGE, changed_values, read_saved_config
    from transfer.analysis.study_records import read_json

    from .run import RunPaths

    run = RunPaths.of(opt.output_dir, method, seed)
    record = os.path.join(opt.records, f"{method}_seed{seed}.json") if opt.records else ""
    done = next((p for p in (run.study_json, record) if p and os.path.isfile(p)), "")
    if done:
        result = read_json(done)
        found = _differences(_pairs(result.get("overrides")), _pairs(opt.overrides(method)))
        if "eval_settings" in result:
            found += _differences(result["eval_settings"], opt.eval_settings())
        return found
    saved = read_saved_config(run.dir)  # None: nothing trained yet
    if saved is None:
        return []
    cfg = cfgs[method].clone()
    cfg.defrost()
    cfg.merge_from_list(["SEED", seed, "OUTPUT_DIR", run.dir])
    changes = changed_values(saved, cfg, RESUME_MAY_CHANGE)
    return [f"{k} {old} (now {new})" for k, (old, new) in changes.items()]


def check_same_settings(opt: StudyOptions, cfgs: dict[str, CfgNode]) -> None:
    """:class:`StudyError` when a run the study would skip or resume was made with other
    overrides or evaluation settings than ``opt``'s (``cfgs``: :func:`load_method_configs`):
    its results would be reused as if made with these, and the page would mix the two. One line
    naming each difference once; reads only."""
    differ: dict[str, None] = {}
    runs = 0
    for method in opt.methods:
        for seed in opt.seeds:
            found = _run_differences(opt, cfgs, method, seed)
            runs += bool(found)
            differ.update(dict.fromkeys(found))
    if differ:
        where = f"--output-dir {opt.output_dir}" + (
            f" (or --records {opt.records})" if opt.records else ""
        )
        raise StudyError(
            f"{where} holds {runs} run(s) of this study made with other settings: "
            f"{'; '.join(differ)}. Give these settings another --output-dir (and --records); "
            "the same settings resume the study, and more --seeds or --methods with them add runs"
        )


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
            max_iter, on = schedule_lengths(cfg, sizes[where])[1], prior_on_iter(cfg, sizes[where])
        except ConfigError:  # a batch larger than the data: the run itself says so
            continue
        if on is not None and on >= max_iter:
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
