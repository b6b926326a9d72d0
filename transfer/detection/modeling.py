"""Model parts the detection configs name, registered in detectron2's registries on import.

``Res5ROIHeadsExtraNorm`` is MoCo's C4 head (``moco/detection/train_net.py``): detectron2's
``Res5ROIHeads`` with a normalisation layer (``MODEL.RESNETS.NORM``) after res5, so that the
features the box and mask predictors see are normalised as in the FPN models, whose heads read
normalised FPN levels. MoCo adds it by overriding the private ``_build_res5_block``; here it is
appended in the public ``from_config``, which builds the same modules under the same names
(``roi_heads.res5.norm.*``).

``DeepLabV3PlusImagePoolHead`` is detectron2's DeepLabV3+ head whose ASPP pools the whole image
(see the class), for PASCAL VOC's test images of varying size.
"""

from __future__ import annotations

from detectron2.config import CfgNode
from detectron2.layers import ShapeSpec, get_norm
from detectron2.modeling import ROI_HEADS_REGISTRY, SEM_SEG_HEADS_REGISTRY
from detectron2.modeling.roi_heads import Res5ROIHeads
from detectron2.projects.deeplab import DeepLabV3PlusHead

__all__ = ["DeepLabV3PlusImagePoolHead", "Res5ROIHeadsExtraNorm"]


@ROI_HEADS_REGISTRY.register()
class Res5ROIHeadsExtraNorm(Res5ROIHeads):
    """``Res5ROIHeads`` whose res5 ends in a ``MODEL.RESNETS.NORM`` layer (MoCo's C4 head)."""

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: dict[str, ShapeSpec]) -> dict:
        ret = super().from_config(cfg, input_shape)
        res5 = ret["res5"]  # nn.Sequential of the res5 blocks
        res5.add_module("norm", get_norm(cfg.MODEL.RESNETS.NORM, res5[-1].out_channels))
        return ret


@SEM_SEG_HEADS_REGISTRY.register()
class DeepLabV3PlusImagePoolHead(DeepLabV3PlusHead):
    """detectron2's ``DeepLabV3PlusHead`` whose ASPP image-pooling branch averages the whole
    feature map (``train_size=None``) instead of a window of the training crop's size.

    On training crops the two are the same (the window is the whole map). They differ when
    evaluating: detectron2's window needs every test image to be a multiple of the crop
    (Cityscapes' 1024x2048 images are, for 512x1024 crops), which PASCAL VOC's images of
    varying size (up to 500x500) are not; TF DeepLab pools the whole (padded) image there.
    """

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: dict[str, ShapeSpec]) -> dict:
        return {**super().from_config(cfg, input_shape), "train_size": None}
