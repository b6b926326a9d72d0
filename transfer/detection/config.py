"""detectron2 configs for detection: plain detectron2 YAML loaded strictly on top of ``get_cfg()``
(:func:`pretrain.config.strict.load_strict`; DeepLab configs on top of ``get_cfg()`` with
``detectron2.projects.deeplab.add_deeplab_config``), with ResNet-18/34 derived from
``MODEL.RESNETS.DEPTH`` alone and SyncBN, data workers and precise-BN fitted to CPU runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from detectron2.config import CfgNode, get_cfg
from detectron2.projects.deeplab import add_deeplab_config

from pretrain.config.strict import load_strict
from pretrain.data.loader import AUTO_WORKERS, resolve_num_workers
from pretrain.utils.errors import ConfigError, LoracError

from . import modeling  # noqa: F401 - registers the heads the configs name

__all__ = [
    "DetectionSetupError",
    "check_semantic_crop",
    "check_solver_numbers",
    "derive_basic_block_keys",
    "fit_precise_bn_to_cpu",
    "fit_workers_to_cores",
    "is_semantic",
    "ignore_amp_on_cpu",
    "load_config",
    "needs_deeplab_keys",
    "use_naive_syncbn_on_cpu",
]

# detectron2's default MODEL.RESNETS.RES2_OUT_CHANNELS, that of bottleneck ResNets (R50 and up)
_BOTTLENECK_RES2_OUT = 256


class DetectionSetupError(LoracError):
    """A dataset or weights problem found before training; the message is one line."""


def load_config(config_file: str, opts: Sequence[str] = ()) -> CfgNode:
    """detectron2's ``get_cfg()`` merged with ``config_file`` and ``KEY VALUE`` ``opts``
    (not frozen: the trainer adapts it first)."""
    if not config_file:
        raise ConfigError("no config file given (--config-file)")
    cfg = get_cfg()
    if needs_deeplab_keys(config_file, opts):
        add_deeplab_config(cfg)
    cfg = load_strict(cfg, config_file, opts)
    check_solver_numbers(cfg)
    derive_basic_block_keys(cfg, config_file)
    check_semantic_crop(cfg)
    return cfg


def is_semantic(cfg: CfgNode) -> bool:
    """Whether ``cfg`` builds a semantic segmentation model (Semantic FPN, DeepLab)."""
    return cfg.MODEL.META_ARCHITECTURE == "SemanticSegmentor"


def check_semantic_crop(cfg: CfgNode) -> None:
    """Raise :class:`ConfigError` unless a semantic segmentation config that crops crops a fixed
    size (``INPUT.CROP.TYPE absolute``), as its augmentations and DeepLab's head need."""
    crop = cfg.INPUT.CROP
    if is_semantic(cfg) and crop.ENABLED and crop.TYPE != "absolute":
        raise ConfigError(
            f"INPUT.CROP.TYPE {crop.TYPE!r}: semantic segmentation crops a fixed size; set "
            "INPUT.CROP.TYPE absolute and INPUT.CROP.SIZE (height, width)"
        )


def _dotted(node: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out |= _dotted(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _deeplab_keys() -> set[str]:
    """The keys ``add_deeplab_config`` adds to detectron2's defaults."""
    cfg = get_cfg()
    plain = set(_dotted(cfg))
    add_deeplab_config(cfg)
    return set(_dotted(cfg)) - plain


def needs_deeplab_keys(config_file: str, opts: Sequence[str] = ()) -> bool:
    """Whether ``config_file`` (its ``_BASE_`` chain) or ``opts`` is a DeepLab config: it builds
    ``build_resnet_deeplab_backbone`` or a ``DeepLab*`` head, or sets a key that
    ``add_deeplab_config`` adds (``SOLVER.POLY_LR_POWER``, ``MODEL.RESNETS.STEM_TYPE``, ...).
    Only those configs get DeepLab's keys, so every other config stays plain detectron2 (and a
    DeepLab key in a COCO config stays an unknown key). A file that cannot be read answers
    False: :func:`load_strict` then reports it."""
    try:
        chain = _dotted(CfgNode.load_yaml_with_base(config_file, allow_unsafe=True))
    except Exception:  # noqa: BLE001 - any unreadable file is load_strict's to report
        chain = {}
    chain |= dict(zip(opts[::2], opts[1::2], strict=False))
    deeplab = _deeplab_keys()
    return (
        chain.get("MODEL.BACKBONE.NAME") == "build_resnet_deeplab_backbone"
        or str(chain.get("MODEL.SEM_SEG_HEAD.NAME", "")).startswith("DeepLab")
        or chain.get("SOLVER.LR_SCHEDULER_NAME") == "WarmupPolyLR"
        or any(key in deeplab for key in chain)
    )


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
    """Make ``MODEL.RESNETS.DEPTH 18`` (or 34) enough for a ResNet-18/34 backbone: detectron2
    asserts ``RES2_OUT_CHANNELS = 64`` for basic blocks instead of deriving it, so the bottleneck
    default (256) becomes 64; what basic blocks cannot have (grouped or deformable convolutions, a
    dilated res5, the C4 configs' ``Res5ROIHeads``) raises :class:`ConfigError` naming every key."""
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
    runs on CPU with more than one process (torch's SyncBatchNorm refuses CPU tensors); returns
    the keys changed."""
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
    """Cap ``DATALOADER.NUM_WORKERS`` (``-1``: that number) at the workers pretraining would
    start (:func:`~pretrain.data.loader.resolve_num_workers`): more than the cores slow loading
    down. Returns the note to log when the value changed, else None."""
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
    """On a CPU, cap ``TEST.PRECISE_BN.NUM_ITER`` at ``SOLVER.MAX_ITER`` (a few-iteration smoke
    run would otherwise spend most of its time there); returns the note to log, else None."""
    bn, max_iter = cfg.TEST.PRECISE_BN, cfg.SOLVER.MAX_ITER
    given, fit = bn.NUM_ITER, max(max_iter, 1)
    if not bn.ENABLED or cfg.MODEL.DEVICE != "cpu" or given <= fit:
        return None
    bn.NUM_ITER = fit
    return (
        f"TEST.PRECISE_BN.NUM_ITER {given} -> {fit} on the CPU: precise-BN re-estimates "
        f"BatchNorm statistics with no more forward passes than SOLVER.MAX_ITER ({max_iter})"
    )


def ignore_amp_on_cpu(cfg: CfgNode) -> str | None:
    """On a CPU, turn ``SOLVER.AMP.ENABLED`` off (detectron2's ``AMPTrainer`` is float16
    autocast with a CUDA grad scaler and asserts a GPU); returns the note to log, else None."""
    if not cfg.SOLVER.AMP.ENABLED or cfg.MODEL.DEVICE != "cpu":
        return None
    cfg.SOLVER.AMP.ENABLED = False
    return (
        "SOLVER.AMP.ENABLED True -> False on the CPU: detectron2's AMPTrainer (float16 "
        "autocast) needs a GPU; this run trains in float32"
    )
