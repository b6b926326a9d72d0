"""detectron2 configs for detection, loaded by the project's one strict loader.

The project adds no config keys: its configs are plain detectron2 YAML, loaded by
:func:`pretrain.config.strict.load_strict` on top of detectron2's ``get_cfg()``, so an unknown key,
a type mismatch or an unreadable file raises :class:`~pretrain.utils.errors.ConfigError`
naming the file (following the ``_BASE_`` chain) or command-line option that holds it. This
module also derives what detectron2 needs for ResNet-18/34 backbones from ``MODEL.RESNETS.DEPTH``
alone, adapts ``SyncBN`` for multi-process CPU runs, fits the data workers to the cores and
precise-BN to a CPU run's length. :class:`DetectionSetupError` is left for the other problems
found before training: datasets and weights.
"""

from __future__ import annotations

from collections.abc import Sequence

from detectron2.config import CfgNode, get_cfg

from pretrain.config.strict import load_strict
from pretrain.data.loader import AUTO_WORKERS, resolve_num_workers
from pretrain.utils.errors import ConfigError, LoracError

__all__ = [
    "DetectionSetupError",
    "check_solver_numbers",
    "derive_basic_block_keys",
    "fit_precise_bn_to_cpu",
    "fit_workers_to_cores",
    "load_config",
    "use_naive_syncbn_on_cpu",
]

# detectron2's default MODEL.RESNETS.RES2_OUT_CHANNELS, that of bottleneck ResNets (R50 and up)
_BOTTLENECK_RES2_OUT = 256


class DetectionSetupError(LoracError):
    """A dataset or weights problem found before training; the message is one line."""


def load_config(config_file: str, opts: Sequence[str] = ()) -> CfgNode:
    """detectron2's ``get_cfg()`` merged with ``config_file`` and ``KEY VALUE`` ``opts``
    (not frozen: the trainer adapts it first).

    Raises :class:`ConfigError` naming the file and key for unknown keys, type mismatches or
    unreadable files.
    """
    if not config_file:
        raise ConfigError("no config file given (--config-file)")
    cfg = load_strict(get_cfg(), config_file, opts)
    check_solver_numbers(cfg)
    derive_basic_block_keys(cfg, config_file)
    return cfg


def check_solver_numbers(cfg: CfgNode) -> None:
    """Raise :class:`ConfigError` for a training number out of range (a negative learning rate,
    an empty batch), which detectron2 and torch would refuse only once the run has started."""
    s = cfg.SOLVER
    checks = [
        ("SOLVER.BASE_LR", s.BASE_LR, 0 < s.BASE_LR < float("inf"), "must be > 0"),
        ("SOLVER.IMS_PER_BATCH", s.IMS_PER_BATCH, s.IMS_PER_BATCH > 0, "must be > 0"),
        ("SOLVER.MAX_ITER", s.MAX_ITER, s.MAX_ITER >= 0, "must be >= 0"),
        ("SOLVER.CHECKPOINT_PERIOD", s.CHECKPOINT_PERIOD, s.CHECKPOINT_PERIOD > 0, "must be > 0"),
        ("SOLVER.WARMUP_ITERS", s.WARMUP_ITERS, s.WARMUP_ITERS >= 0, "must be >= 0"),
        ("SOLVER.MOMENTUM", s.MOMENTUM, 0 <= s.MOMENTUM < 1, "must be in [0, 1)"),
        ("SOLVER.WEIGHT_DECAY", s.WEIGHT_DECAY, s.WEIGHT_DECAY >= 0, "must be >= 0"),
        ("TEST.EVAL_PERIOD", cfg.TEST.EVAL_PERIOD, cfg.TEST.EVAL_PERIOD >= 0, "must be >= 0"),
    ]
    for key, value, ok, why in checks:
        if not ok:
            raise ConfigError(f"{key} = {value!r}: {why}")


def derive_basic_block_keys(cfg: CfgNode, source: str = "config") -> None:
    """Make ``MODEL.RESNETS.DEPTH 18`` (or 34) enough for a ResNet-18/34 backbone.

    Those ResNets are built of basic blocks whose res2 has 64 output channels, and detectron2's
    ``build_resnet_backbone`` asserts ``RES2_OUT_CHANNELS = 64`` instead of deriving it from
    the depth: the default (256, for bottleneck ResNets) is changed to 64 here. What basic blocks
    cannot have (grouped or deformable convolutions, a dilated res5, the C4 configs'
    ``Res5ROIHeads``, which builds res5 of bottleneck blocks inside the ROI heads) raises
    :class:`ConfigError` naming every key, ``source`` (the config file) first."""
    r = cfg.MODEL.RESNETS
    if r.DEPTH not in (18, 34) or "resnet" not in cfg.MODEL.BACKBONE.NAME:
        return
    if r.RES2_OUT_CHANNELS == _BOTTLENECK_RES2_OUT:
        r.RES2_OUT_CHANNELS = 64
    wrong = []
    if r.RES2_OUT_CHANNELS != 64:
        wrong.append(f"MODEL.RESNETS.RES2_OUT_CHANNELS {r.RES2_OUT_CHANNELS} (must be 64)")
    if r.NUM_GROUPS != 1:
        wrong.append(f"MODEL.RESNETS.NUM_GROUPS {r.NUM_GROUPS} (must be 1)")
    if r.RES5_DILATION != 1:
        wrong.append(f"MODEL.RESNETS.RES5_DILATION {r.RES5_DILATION} (must be 1)")
    if any(r.DEFORM_ON_PER_STAGE):
        wrong.append(f"MODEL.RESNETS.DEFORM_ON_PER_STAGE {list(r.DEFORM_ON_PER_STAGE)} (no True)")
    if cfg.MODEL.ROI_HEADS.NAME == "Res5ROIHeads":
        wrong.append(
            "MODEL.ROI_HEADS.NAME Res5ROIHeads (a C4 config builds res5 of bottleneck blocks; use "
            "an FPN config such as configs/coco_faster_rcnn_lorac.yaml)"
        )
    if wrong:
        raise ConfigError(
            f"{source}: MODEL.RESNETS.DEPTH {r.DEPTH} (a ResNet of basic blocks) does not go "
            f"with {'; '.join(wrong)}"
        )


def use_naive_syncbn_on_cpu(cfg: CfgNode, world_size: int) -> list[str]:
    """Replace ``SyncBN`` by detectron2's ``naiveSyncBN`` in every ``*.NORM`` key when ``cfg``
    runs on CPU with more than one process (torch's SyncBatchNorm refuses CPU tensors then).

    ``cfg`` must be mutable; returns the full names of the keys changed, for the caller to log.
    """
    if world_size <= 1 or cfg.MODEL.DEVICE != "cpu":
        return []
    changed: list[str] = []

    def visit(node: CfgNode, path: str) -> None:
        for key, value in node.items():
            if isinstance(value, CfgNode):
                visit(value, f"{path}{key}.")
            elif key == "NORM" and value == "SyncBN":
                node[key] = "naiveSyncBN"
                changed.append(path + key)

    visit(cfg, "")
    return sorted(changed)


def fit_workers_to_cores(cfg: CfgNode, procs_on_machine: int) -> str | None:
    """Cap ``DATALOADER.NUM_WORKERS`` (detectron2's default: 4) at the workers pretraining would
    start (:func:`~pretrain.data.loader.resolve_num_workers`: the cores of this process less
    one, shared by the ``procs_on_machine`` processes); ``-1`` means that number, as in
    pretraining. More workers than cores slow loading down and make torch warn in every loader.

    ``cfg`` must be mutable; returns the note to log when the value changed, else None."""
    given = cfg.DATALOADER.NUM_WORKERS
    fit = min(
        resolve_num_workers(given, procs_on_machine),
        resolve_num_workers(AUTO_WORKERS, procs_on_machine),
    )
    if fit == given:
        return None
    cfg.DATALOADER.NUM_WORKERS = fit
    return (
        f"DATALOADER.NUM_WORKERS {given} -> {fit}: the cores of this process, "
        f"{procs_on_machine} process(es) on this machine, less one for the training process"
    )


def fit_precise_bn_to_cpu(cfg: CfgNode) -> str | None:
    """On a CPU, cap ``TEST.PRECISE_BN.NUM_ITER`` (200 forward passes each time it runs) at
    ``SOLVER.MAX_ITER``, so that it costs no more forward passes than the training had
    iterations (a few-iteration smoke run on a CPU otherwise spends most of its time there).
    Runs of at least NUM_ITER iterations, and every GPU run, keep the config's value.

    ``cfg`` must be mutable; returns the note to log when the value changed, else None."""
    bn, max_iter = cfg.TEST.PRECISE_BN, cfg.SOLVER.MAX_ITER
    given, fit = bn.NUM_ITER, max(max_iter, 1)
    if not bn.ENABLED or cfg.MODEL.DEVICE != "cpu" or given <= fit:
        return None
    bn.NUM_ITER = fit
    return (
        f"TEST.PRECISE_BN.NUM_ITER {given} -> {fit} on the CPU: precise-BN re-estimates "
        f"BatchNorm statistics with no more forward passes than SOLVER.MAX_ITER ({max_iter})"
    )
