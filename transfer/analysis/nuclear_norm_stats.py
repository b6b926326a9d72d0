"""Nuclear norm of augmented test views (paper Sec. 6.2 "Test Data Nuclear Norm Statistics").

Per test image, V = 32 views of the run's own large-crop augmentation go through the query
encoder (eval mode); the V x d matrix Q_hat of L2-normalised embeddings has a nuclear norm
between sqrt(V) (identical views) and sqrt(V * rank). Image ``i``'s crops and colours are seeded
by ``sample_seed(seed, i, 0 / 1)``, so values do not depend on batching or on the other images,
and two models with the same augmentation see the same views.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from fvcore.common.config import CfgNode
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS

from pretrain.data.color import BatchColorAugment, ColorSpec
from pretrain.data.datasets import (
    FASHION_MNIST,
    BadImageError,
    DatasetError,
    FashionMNISTSource,
    ImageFolderSource,
    TransformedDataset,
    dataset_type,
    load_image,
    skipped_note,
)
from pretrain.data.sampler import sample_seed
from pretrain.data.splits import evenly_spaced
from pretrain.data.transforms import CropSpec, MultiCropTransform
from pretrain.evaluation.features import FeatureFn
from pretrain.evaluation.knn import KNN_K
from pretrain.evaluation.knn import knn_top1 as _knn_top1
from pretrain.losses.lorac import nuclear_norm
from pretrain.utils.progress import progress
from transfer.analysis import AnalysisError
from transfer.analysis.runs import beta_label
from transfer.classification.transforms import eval_transform
from transfer.tables import read_csv

logger = logging.getLogger(__name__)

__all__ = [
    "ModelStats",
    "augmented_nuclear_norms",
    "knn_top1",
    "open_split",
    "read_accuracy_csv",
    "view_spec",
]


@dataclass
class ModelStats:
    """The analysis of one model: per-image nuclear norms and (optionally) an accuracy in %."""

    label: str
    checkpoint: str
    prior: str
    beta: float
    indices: list[int]
    classes: list[int]
    values: np.ndarray  # (n_images,) float64
    top1: float | None = None
    top1_source: str = ""
    prior_never_on: bool = False  # trained with beta = inf throughout: shown as such

    @property
    def trained_beta(self) -> float:
        """The beta these weights trained with: inf when the prior never turned on."""
        return math.inf if self.prior_never_on else self.beta

    @property
    def beta_text(self) -> str:
        return beta_label(self.beta, self.prior_never_on)


def _decodes_or_warns(path: str) -> bool:
    try:
        load_image(path)
    except BadImageError as e:
        logger.warning(f"skipped unreadable image: {e}")
        return False
    return True


def open_split(
    dataset: str, root: str, split: str, class_list: str = "", count: int = 0
) -> tuple[FashionMNISTSource | ImageFolderSource, list[int]]:
    """The ``test`` (or ``train``) images of ``dataset`` as ``(source, indices)``: a pretrain
    image source and ``count`` evenly spaced indices into it (all when ``count`` <= 0); an image
    folder with ``train/`` and ``val/`` gives ``val/`` as the test images."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    try:
        kind = dataset_type(dataset)
    except DatasetError as e:
        raise AnalysisError(f"--dataset: {e}") from None
    sub = os.path.join(root, "val" if split == "test" else "train")
    if kind == FASHION_MNIST:
        source = FashionMNISTSource(root, split)
    elif split == "train" and not os.path.isdir(sub):
        raise AnalysisError(f"{root}: no train/ folder for the kNN reference images")
    else:  # image files only (others left out and counted), as the other evaluations
        folder = sub if os.path.isdir(sub) else root
        source = ImageFolderSource(folder, class_list, extensions=IMG_EXTENSIONS)
    indices = evenly_spaced(len(source), count)
    if kind != FASHION_MNIST:
        # each image's values are kept by its index: an unreadable one is left out here, before
        # any model runs, rather than from a batch (as the kNN does)
        paths = progress([source.describe(i) for i in indices], desc="checking images", unit="img")
        readable = [i for i, path in zip(indices, paths, strict=True) if _decodes_or_warns(path)]
        note = skipped_note(f"{folder} ({split})", len(indices), len(readable))
        if note:
            logger.warning(note)
        indices = readable
    return source, indices


def view_spec(cfg: CfgNode, views: int) -> tuple[CropSpec, ColorSpec]:
    """The run's large-crop spec with ``views`` crops, and its colour spec."""
    from pretrain.data.loader import build_train_transform

    _, color = build_train_transform(cfg)
    return CropSpec(cfg.INPUT.LARGE_SIZE, tuple(cfg.INPUT.LARGE_SCALE), views), color


class AugmentedViews(Dataset):
    """Item k: the uint8 crops (V, 3, s, s) of image ``indices[k]`` and that image index."""

    def __init__(
        self,
        source: FashionMNISTSource | ImageFolderSource,
        indices: Sequence[int],
        crop: CropSpec,
        color: ColorSpec,
        seed: int,
    ) -> None:
        self.source, self.indices, self.seed = source, list(indices), seed
        self.transform = MultiCropTransform([crop], color, color_on_device=True)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, int]:
        i = self.indices[k]
        g = torch.Generator().manual_seed(sample_seed(self.seed, i, 0))
        return torch.stack(self.transform(self.source.load(i), g)), i


@torch.no_grad()
def augmented_nuclear_norms(
    encoder: torch.nn.Module,
    source: FashionMNISTSource | ImageFolderSource,
    indices: Sequence[int],
    crop: CropSpec,
    color: ColorSpec,
    *,
    seed: int = 0,
    batch_images: int = 8,
    num_workers: int = 0,
    device: str | torch.device = "cpu",
    desc: str = "nuclear norm",
) -> np.ndarray:
    """||Q_hat||_* per image: ``crop.count`` augmented views through ``encoder`` (eval mode)."""
    encoder.eval()
    device = torch.device(device)
    loader = DataLoader(
        AugmentedViews(source, indices, crop, color, seed),
        batch_size=batch_images,
        num_workers=num_workers,
        pin_memory=device.type == "cuda",
    )
    augment = BatchColorAugment(color)
    out = []
    with progress(total=len(indices), desc=desc, unit="img") as bar:
        for views, idx in loader:
            b, v = views.shape[:2]
            batch = [
                augment(
                    [views[j].to(device, non_blocking=True)],
                    torch.Generator().manual_seed(sample_seed(seed, int(idx[j]), 1)),
                )[0]
                for j in range(b)
            ]
            emb = encoder(torch.cat(batch)).float().view(b, v, -1)  # (B, V, d)
            out.append(nuclear_norm(emb).double().cpu())
            bar.update(b)
    return torch.cat(out).numpy()


def knn_top1(
    model: torch.nn.Module | FeatureFn,
    train: tuple[object, Sequence[int]],
    test: tuple[object, Sequence[int]],
    *,
    size: int,
    crop_fraction: float,
    device: str | torch.device = "cpu",
    k: int = KNN_K,
    batch_size: int = 256,
    num_workers: int = 0,
) -> float:
    """Weighted kNN top-1 in % of ``model``'s pooled features (a backbone, or a pretraining
    model's ``backbone_features``) on centre crops ``size`` of images resized to ``size /
    crop_fraction``; ``train`` and ``test`` are ``(source, indices)``."""
    tf = eval_transform(round(size / crop_fraction), size)
    top1 = _knn_top1(
        model,
        TransformedDataset(train[0], tf, train[1]),
        TransformedDataset(test[0], tf, test[1]),
        k=k,
        device=device,
        batch_size=batch_size,
        num_workers=num_workers,
    )
    return 100.0 * top1


_KEY_COLUMNS = ("label", "run", "Method", "Model")


def read_accuracy_csv(path: str) -> dict[str, float]:
    """``{run or label: top-1 in %}`` from a CSV with a key column (label, run, Method or Model)
    and a top-1 column (``top1``, ``Top-1`` or one ending in ``top-1``, e.g. knn.csv's)."""
    table = read_csv(path)
    key = next((c for c in _KEY_COLUMNS if c in table.columns), None)
    exact = [c for c in table.columns if c in ("top1", "Top-1")]
    suffix = [c for c in table.columns if c.lower().endswith("top-1")]
    value = exact[0] if exact else (suffix[0] if len(suffix) == 1 else None)
    if key is None or value is None:
        raise AnalysisError(
            f"{path}: needs a key column ({', '.join(_KEY_COLUMNS)}) and one top-1 column (top1, "
            f"Top-1 or '... top-1'); found {table.columns}"
        )
    out: dict[str, float] = {}
    for i, row in enumerate(table.rows):
        name = row[key]
        if name in out:
            raise AnalysisError(f"{path}: {key} {name!r} appears twice")
        top1 = table.number(i, value)
        if top1 is None:
            continue
        if not 0.0 <= top1 <= 100.0:
            raise AnalysisError(f"{path}: row {i + 1}: top-1 {top1} is not a percentage")
        out[name] = top1
    return out


def accuracy_for(accuracy: dict[str, float], label: str, path: str) -> float | None:
    """The accuracy CSV entry of a model, by label, path as given, or run directory name."""
    for key in (label, path, os.path.abspath(path), os.path.basename(path.rstrip(os.sep))):
        if key in accuracy:
            return accuracy[key]
    return None


def summary_row(s: ModelStats) -> dict[str, object]:
    v = s.values
    return {
        "model": s.label,
        "prior": s.prior,
        "beta": s.beta_text,
        "images": len(v),
        "mean_nuclear_norm": f"{v.mean():.4f}",
        "std_nuclear_norm": f"{v.std():.4f}",
        "median_nuclear_norm": f"{np.median(v):.4f}",
        "checkpoint": s.checkpoint,
    }
