"""Model parts the detection configs name, registered in detectron2's registries on import.

``Res5ROIHeadsExtraNorm`` is MoCo's C4 head (``moco/detection/train_net.py``): detectron2's
``Res5ROIHeads`` with a normalisation layer (``MODEL.RESNETS.NORM``) after res5, so that the
features the box and mask predictors see are normalised as in the FPN models, whose heads read
normalised FPN levels. MoCo adds it by overriding the private ``_build_res5_block``; here it is
appended in the public ``from_config``, which builds the same modules under the same names
(``roi_heads.res5.norm.*``).
"""

from __future__ import annotations

from detectron2.config import CfgNode
from detectron2.layers import ShapeSpec, get_norm
from detectron2.modeling import ROI_HEADS_REGISTRY
from detectron2.modeling.roi_heads import Res5ROIHeads

__all__ = ["Res5ROIHeadsExtraNorm"]


@ROI_HEADS_REGISTRY.register()
class Res5ROIHeadsExtraNorm(Res5ROIHeads):
    """``Res5ROIHeads`` whose res5 ends in a ``MODEL.RESNETS.NORM`` layer (MoCo's C4 head)."""

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: dict[str, ShapeSpec]) -> dict:
        ret = super().from_config(cfg, input_shape)
        res5 = ret["res5"]  # nn.Sequential of the res5 blocks
        res5.add_module("norm", get_norm(cfg.MODEL.RESNETS.NORM, res5[-1].out_channels))
        return ret
