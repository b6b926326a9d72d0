"""Published reference rows printed below each protocol's runs by the detection collector.

Keyed by the protocol title of :func:`transfer.detection.results.run_protocol` for the shipped
configs, each row is ``(label, {column: value}, source)``; a column the source does not report
stays empty. Only figures read in the cited source are here: a protocol whose published numbers
were not found has no rows (COCO 1x R50-FPN/C4 of MoCo's Tables 5a/5c, LVIS v1, which MoCo did
not run (its LVIS numbers are v0.5), and the semantic segmentation heads, whose published MoCo
numbers are of an FCN head, not Semantic FPN or DeepLabV3+).
"""

from __future__ import annotations

__all__ = ["PUBLISHED"]

_MOCO_README = "MoCo, detection/README.md (github.com/facebookresearch/moco)"
_MOCO_T5B = "MoCo (He et al., CVPR 2020), Table 5b; keypoints: Table 6"
_MOCO_T5D = "MoCo (He et al., CVPR 2020), Table 5d"
_MOCO_T6 = "MoCo (He et al., CVPR 2020), Table 6 (AP50 only)"


def _box(ap50: float, ap: float, ap75: float) -> dict[str, float]:
    return {"box AP50": ap50, "box AP": ap, "box AP75": ap75}


def _mask_rcnn(box: tuple[float, ...], mask: tuple[float, ...]) -> dict[str, float]:
    cols = ("AP", "AP50", "AP75")
    return {f"Mask R-CNN box {m}": v for m, v in zip(cols, box, strict=True)} | {
        f"Mask R-CNN mask {m}": v for m, v in zip(cols, mask, strict=True)
    }


PUBLISHED: dict[str, list[tuple[str, dict[str, float], str]]] = {
    # Faster R-CNN R50-C4, VOC07+12 trainval -> VOC07 test, 24k iterations
    "Pascal VOC, R50-C4, 24k iterations of 16": [
        ("supervised IN-1K (published)", _box(81.3, 53.5, 58.8), _MOCO_README),
        ("MoCo v2 200ep (published)", _box(82.4, 57.0, 63.6), _MOCO_README),
        ("MoCo v2 800ep (published)", _box(82.5, 57.4, 64.0), _MOCO_README),
    ],
    # Mask R-CNN (and Keypoint R-CNN) R50-FPN, 2x; MoCo v1, IN-1M, 200 epochs
    "COCO, R50-FPN, 2x": [
        (
            "supervised IN-1M (published)",
            _mask_rcnn((40.6, 61.3, 44.4), (36.8, 58.1, 39.5))
            | {"Keypoint R-CNN keypoints AP": 65.8},
            _MOCO_T5B,
        ),
        (
            "MoCo v1 IN-1M (published)",
            _mask_rcnn((40.8, 61.6, 44.7), (36.9, 58.4, 39.7))
            | {"Keypoint R-CNN keypoints AP": 66.8},
            _MOCO_T5B,
        ),
    ],
    "COCO, R50-C4, 2x": [
        (
            "supervised IN-1M (published)",
            _mask_rcnn((40.0, 59.9, 43.1), (34.7, 56.5, 36.9)),
            _MOCO_T5D,
        ),
        (
            "MoCo v1 IN-1M (published)",
            _mask_rcnn((40.7, 60.5, 44.1), (35.4, 57.3, 37.6)),
            _MOCO_T5D,
        ),
    ],
    "Cityscapes instance segmentation, R50-FPN, 24k iterations of 8": [
        ("supervised IN-1M (published)", {"mask AP50": 59.6}, _MOCO_T6),
        ("MoCo v1 IN-1M (published)", {"mask AP50": 59.3}, _MOCO_T6),
    ],
}
