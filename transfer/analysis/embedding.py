"""A picture of a run's features: a 2-D t-SNE (scikit-learn) of the kNN monitor's features of
evenly spaced labelled test images, coloured by class, beside the same picture for a randomly
initialised network of the same config (``torch.manual_seed(SEED)``).

The images, crops and features are the kNN monitor's (:func:`pretrain.evaluation.knn_monitor.
knn_sources` and :func:`~pretrain.evaluation.knn_monitor.knn_transform`, the model's
``backbone_features``, :func:`pretrain.evaluation.features.extract_features`), L2-normalised as
the kNN reads them. t-SNE: 2 components, PCA initialisation, perplexity min(30, (N - 1) / 3), a
fixed ``random_state``; its distances between clusters mean little, its neighbourhoods do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pretrain.data.datasets import FASHION_MNIST, TransformedDataset
from pretrain.data.splits import evenly_spaced
from pretrain.evaluation.features import extract_features
from pretrain.evaluation.knn_monitor import knn_sources, knn_transform
from pretrain.utils.errors import LoracError
from transfer.analysis import AnalysisError, plots
from transfer.analysis.models import load_pretrained

__all__ = ["EMBEDDING_PNG", "EmbeddingPicture", "draw_embedding", "tsne_2d"]

EMBEDDING_PNG = "embedding_tsne.png"  # in the run directory


def tsne_2d(features: torch.Tensor, seed: int = 0) -> np.ndarray:
    """(N, 2) t-SNE coordinates of the L2-normalised ``features`` (N, D), N >= 4."""
    from sklearn.manifold import TSNE

    n = features.shape[0]
    if n < 4:
        raise AnalysisError(f"t-SNE needs at least 4 images, got {n}")
    x = F.normalize(features.double(), dim=1).numpy()
    tsne = TSNE(2, perplexity=min(30.0, (n - 1) / 3), init="pca", random_state=seed)
    return tsne.fit_transform(x)


@dataclass
class EmbeddingPicture:
    path: str  # the PNG
    images: int
    classes: int
    points: int  # drawn, both panels


def draw_embedding(
    run: str,
    out_png: str = "",
    images: int = 300,
    device: str = "cpu",
    batch_size: int = 64,
) -> EmbeddingPicture:
    """Draw the t-SNE picture of run directory (or checkpoint) ``run`` beside random init
    into ``out_png`` (default: ``<run dir>/embedding_tsne.png``). :class:`AnalysisError` when the
    run or its labelled images cannot be read."""
    from pretrain.modeling import build_model

    loaded = load_pretrained(run, device=device)
    cfg = loaded.cfg
    if cfg.DATASETS.TYPE != FASHION_MNIST and not cfg.TEST.KNN_ROOT:
        raise AnalysisError(
            f"{run}: TEST.KNN_ROOT is empty, so no labelled images (train/ and val/ class "
            "folders) to draw"
        )
    try:
        _, source = knn_sources(cfg)  # the monitor's labelled test images
    except (LoracError, OSError) as e:
        raise AnalysisError(f"{run}: no labelled images for the picture: {e}") from None
    if images < 4:
        raise AnalysisError(f"--images {images}: t-SNE needs at least 4")
    data = TransformedDataset(
        source, knn_transform(cfg.INPUT.LARGE_SIZE), evenly_spaced(len(source), images)
    )
    torch.manual_seed(cfg.SEED)
    random_init = build_model(cfg).eval()
    panels = []
    for title, model in (("random init", random_init), (loaded.label, loaded.model)):
        feats, labels = extract_features(
            model.backbone_features, data, device, batch_size, desc=f"features: {title}"
        )
        panels.append((title, tsne_2d(feats, cfg.SEED), labels.numpy()))
    out_png = out_png or os.path.join(os.path.dirname(loaded.checkpoint), EMBEDDING_PNG)
    names = list(getattr(source, "classes", []))
    drawn = plots.plot_embeddings(
        panels,
        out_png,
        class_names=names,
        title=f"t-SNE of the kNN features of {len(data)} test images ({loaded.label})",
    )
    return EmbeddingPicture(out_png, len(data), len(set(panels[0][2].tolist())), drawn)
