"""One recipe on any number of processes: ``SOLVER.REFERENCE_WORLD_SIZE`` and the resolution of a
config at a world size (docs/cluster.md, "One, two, four or eight GPUs").

``SOLVER.REFERENCE_WORLD_SIZE`` R is the number of processes the config's ``IMS_PER_BATCH`` and
learning rates were written for. 0 (the default, and every shipped config's) keeps the config as
it is at any world size W: the global batch and the learning rate are the paper's, each process
takes ``IMS_PER_BATCH / W`` images. With R > 0 and W != R the run is rescaled by detectron2's rule
(``DefaultTrainer.auto_scale_workers``: the per-process batch is kept, the learning rate scales
linearly with the global batch, as Goyal et al. 2017), which is written out here rather than
called because detectron2's function rewrites its own keys (``MAX_ITER``, ``WARMUP_ITERS``,
``STEPS``, ``TEST.EVAL_PERIOD``) that this config does not have. With s = W / R:

* ``SOLVER.IMS_PER_BATCH`` x s (the per-process batch ``IMS_PER_BATCH / R`` is kept, and with it
  the memory each process needs);
* ``SOLVER.BASE_LR`` and ``SOLVER.FINAL_LR`` x s (the linear rule; for LARS too, whose trust
  ratio sets each layer's step size relative to the global lr);
* iteration counts / s, rounded, at least 1: ``SOLVER.CHECKPOINT_PERIOD``, ``TEST.KNN_PERIOD``
  (when on) and ``SOLVER.MAX_ITER`` (when set); everything counted in epochs (``EPOCHS``,
  ``WARMUP_EPOCHS``, ``LOSS.BETA_INF_EPOCHS``) follows the new iterations per epoch by itself;
* ShuffleBN: each process keeps its ``MODEL.KEY_BN_SPLITS`` BN groups (of the same size, since the
  per-process batch is kept), except where one process would hold the only group
  (W x KEY_BN_SPLITS = 1): the key encoder's BatchNorm would then see the same batch as the
  query's, the leak ShuffleBN exists to stop (MoCo, Sec. 3.3), so KEY_BN_SPLITS becomes 2, the
  fewest groups that shuffle;
* ``SOLVER.REFERENCE_WORLD_SIZE`` becomes W, so that resolving again (a resume, the dumped
  config.yaml) changes nothing.

A combination that cannot work is one :class:`ConfigError` line: an ``IMS_PER_BATCH`` that R
processes cannot share evenly, a global batch that does not divide ``MODEL.QUEUE_SIZE``, fewer
than 2 images per process (:func:`pretrain.config.defaults.check_world_size`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fvcore.common.config import CfgNode

from pretrain.config.defaults import check_world_size, load_config, validate_cfg
from pretrain.utils.errors import ConfigError

__all__ = ["WORLD_SIZES", "Recipe", "recipe", "recipe_table", "resolve_world_size"]

WORLD_SIZES = (1, 2, 4, 8)  # the recipe table's


def resolve_world_size(cfg: CfgNode, world_size: int) -> CfgNode:
    """``cfg`` as a run on ``world_size`` processes uses it (the same object when nothing
    changes; a copy, frozen as ``cfg`` was, otherwise); :class:`ConfigError` for what cannot
    work."""
    ref = cfg.SOLVER.REFERENCE_WORLD_SIZE
    if ref < 0:
        raise ConfigError(
            f"SOLVER.REFERENCE_WORLD_SIZE = {ref}: must be >= 0 (0: the config as it is at any "
            "number of processes)"
        )
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if ref == 0 or ref == world_size:
        check_world_size(cfg, world_size)
        return cfg
    batch = cfg.SOLVER.IMS_PER_BATCH
    if batch % ref:
        raise ConfigError(
            f"SOLVER.IMS_PER_BATCH = {batch} is not divisible by SOLVER.REFERENCE_WORLD_SIZE = "
            f"{ref}: the per-process batch to keep is not whole; give a global batch that "
            f"{ref} processes share evenly"
        )
    scale = world_size / ref
    out = cfg.clone()
    out.defrost()
    sol = out.SOLVER
    sol.IMS_PER_BATCH = batch // ref * world_size
    sol.BASE_LR = cfg.SOLVER.BASE_LR * scale
    sol.FINAL_LR = cfg.SOLVER.FINAL_LR * scale
    sol.CHECKPOINT_PERIOD = max(1, round(sol.CHECKPOINT_PERIOD / scale))
    if sol.MAX_ITER > 0:
        sol.MAX_ITER = max(1, round(sol.MAX_ITER / scale))
    if out.TEST.KNN_PERIOD > 0:
        out.TEST.KNN_PERIOD = max(1, round(out.TEST.KNN_PERIOD / scale))
    if out.MODEL.SHUFFLE_BN and world_size * out.MODEL.KEY_BN_SPLITS < 2:
        out.MODEL.KEY_BN_SPLITS = 2
    sol.REFERENCE_WORLD_SIZE = world_size
    try:
        validate_cfg(out, world_size)
    except ConfigError as e:
        raise ConfigError(
            f"{e} (after SOLVER.REFERENCE_WORLD_SIZE {ref} rescaled the config to {world_size} "
            "processes)"
        ) from None
    if cfg.is_frozen():
        out.freeze()
    return out


class Recipe(NamedTuple):
    """What a run of a config does on ``world_size`` processes."""

    world_size: int
    ims_per_batch: int  # global
    per_process: int  # images per process (per GPU)
    base_lr: float
    final_lr: float
    key_bn_splits: int  # BN groups of the key encoder in each process
    bn_groups: int  # BN groups over the global key batch (1: ShuffleBN shuffles nothing)

    @property
    def images_per_bn_group(self) -> float:
        return self.per_process / self.key_bn_splits


def recipe(cfg: CfgNode, world_size: int) -> Recipe:
    """The :class:`Recipe` of ``cfg`` resolved at ``world_size`` (:func:`resolve_world_size`)."""
    r = resolve_world_size(cfg, world_size)
    splits = r.MODEL.KEY_BN_SPLITS
    return Recipe(
        world_size,
        r.SOLVER.IMS_PER_BATCH,
        r.SOLVER.IMS_PER_BATCH // world_size,
        r.SOLVER.BASE_LR,
        r.SOLVER.FINAL_LR,
        splits,
        world_size * splits if r.MODEL.SHUFFLE_BN else world_size,
    )


def recipe_table(
    configs: Sequence[tuple[str, CfgNode]], worlds: Sequence[int] = WORLD_SIZES
) -> str:
    """The Markdown table of ``configs`` ((name, config) pairs) at ``worlds`` processes;
    configs whose rows agree share a row group."""
    groups: dict[tuple[Recipe, ...], list[str]] = {}
    for name, cfg in configs:
        groups.setdefault(tuple(recipe(cfg, w) for w in worlds), []).append(name)
    lines = [
        "| configs | GPUs | global batch | per GPU | BASE_LR -> FINAL_LR | KEY_BN_SPLITS "
        "| key BN groups (images each) |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for rows, names in groups.items():
        for i, r in enumerate(rows):
            shown = ", ".join(f"`{n}`" for n in names) if i == 0 else ""
            groups_text = f"{r.bn_groups} ({r.images_per_bn_group:g})"
            if r.bn_groups == 1:
                groups_text += ": no shuffle"
            lines.append(
                f"| {shown} | {r.world_size} | {r.ims_per_batch} | {r.per_process} | "
                f"{r.base_lr:g} -> {r.final_lr:g} | {r.key_bn_splits} | {groups_text} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pretrain.config.world_size REFERENCE CONFIG...``: the docs' recipe table."""
    import os
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    ref = args.pop(0)
    named = [
        (os.path.basename(p), load_config(p, ["SOLVER.REFERENCE_WORLD_SIZE", ref]))
        for p in sorted(args, key=os.path.basename)
    ]
    print(recipe_table(named))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
