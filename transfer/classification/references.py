"""Published figures the classification tables print beside a model's own, with their sources
and what makes them comparable or not (ResNet-50 at 224 px, ImageNet-1K)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FINETUNE_REFERENCES", "Reference", "SVM_LOW_SHOT_K", "VOC07_SVM_REFERENCES"]


@dataclass(frozen=True)
class Reference:
    name: str  # the row's name, "(published)" marks it
    source: str
    note: str  # what the row was computed with; where it is not comparable, why
    values: dict[str, float] = field(default_factory=dict)  # column -> percentage


# BYOL (Grill et al. 2020), Table 3 "Transfer via fine-tuning", row "Supervised-IN [8]" (after
# Kornblith et al. 2019 / SimCLR Appendix B.8). BYOL has no Places365 column.
FINETUNE_REFERENCES = (
    Reference(
        "Supervised IN-1K ResNet-50 (published)",
        "BYOL (Grill et al. 2020) Table 3, fine-tuning, Supervised-IN",
        "ResNet-50, 224 px, the same 20k-step lr x wd search; VOC2007 11-point mAP",
        {
            "Food": 88.3,
            "CIFAR10": 97.5,
            "CIFAR100": 86.4,
            "Birdsnap": 75.8,
            "SUN397": 64.3,
            "Cars": 92.1,
            "Aircraft": 86.0,
            "VOC2007": 85.0,
            "DTD": 74.6,
            "Pets": 92.1,
            "Caltech-101": 93.3,
            "Flowers": 97.6,
        },
    ),
)

SVM_LOW_SHOT_K = (1, 2, 4, 8, 16, 32, 64, 96)

# OpenSelfSup model zoo (docs/MODEL_ZOO.md, "VOC07 SVM & SVM Low-shot", best layer feat5 = res5
# average-pooled 6x6 stride 1 to 2x2x2048 = 8192-d, images resized to 224x224); mmselfsup's
# model zoo has MoCo v2 at 84.04. Low-shot: mean over 5 draws of the best cost.
VOC07_SVM_REFERENCES = (
    Reference(
        "Supervised IN-1K ResNet-50 (published)",
        "OpenSelfSup model zoo (torchvision weights), VOC07 SVM feat5",
        "ResNet-50, res5 pooled to 8192-d (VISSL/OpenSelfSup), 224x224",
        {"VOC07 SVM": 87.17}
        | dict(
            zip(
                [f"k={k}" for k in SVM_LOW_SHOT_K],
                (52.99, 63.55, 73.7, 78.79, 81.76, 83.75, 85.18, 85.97),
                strict=True,
            )
        ),
    ),
    Reference(
        "MoCo v2 200ep ResNet-50 (published)",
        "OpenSelfSup model zoo, selfsup/moco/r50_v2.py, VOC07 SVM feat5 (mmselfsup: 84.04)",
        "ResNet-50, res5 pooled to 8192-d (VISSL/OpenSelfSup), 224x224",
        {"VOC07 SVM": 84.26}
        | dict(
            zip(
                [f"k={k}" for k in SVM_LOW_SHOT_K],
                (43.0, 52.48, 63.43, 71.74, 76.35, 78.9, 81.31, 82.45),
                strict=True,
            )
        ),
    ),
)
