"""detectron2 configs for detection, loaded by the project's one strict loader.

The project adds no config keys: its configs are plain detectron2 YAML, loaded by
:func:`pretrain.config.strict.load_strict` on top of detectron2's ``get_cfg()``, so an unknown key,
a type mismatch or an unreadable file raises :class:`~pretrain.utils.errors.ConfigError`
naming the file (following the ``_BASE_`` chain) or command-line option that holds it. This
module also derives what detectron2 needs for ResNet-18/34 backbones from ``MODEL.RESNETS.DEPTH``
alone, and adapts ``SyncBN`` for multi-process CPU runs. :class:`DetectionSetupError` is left for
the other problems found before training: datasets and weights.
"""

from __future__ import annotations

from collections.abc import Sequence

from detectron2.config import CfgNode, get_cfg

from pretrain.config.strict import load_strict
from pretrain.utils.errors import ConfigError, LoracError

__all__ = [
    "DetectionSetupError",
    "derive_basic_block_keys",
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
    derive_basic_block_keys(cfg, config_file)
    return cfg


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
