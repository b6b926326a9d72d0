"""The `make demo` job: LORAC on Fashion-MNIST, then kNN accuracy vs a random network."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch
from torchvision import transforms as T

from pretrain.checkpoint_io import build_torchvision_backbone, load_backbone
from pretrain.config import load_config
from pretrain.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
from pretrain.modeling import build_model

__all__ = ["DEMO_CONFIG", "DemoResult", "knn_features", "knn_top1", "run_demo"]

DEMO_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "configs", "pretrain", "demo_fashion_mnist_r18.yaml"
)
logger = logging.getLogger("pretrain.demo")


@dataclass
class DemoResult:
    checkpoint: str
    knn_pretrained: float
    knn_random: float
    train_seconds: float
    method: str = "LORAC"


def _knn_splits(dataset_type: str, root: str, size: int, n_train: int, n_test: int):
    """(reference, test) datasets of (normalised tensor, label) for the demo's kNN."""
    from torch.utils.data import Subset
    from torchvision.datasets import ImageFolder

    from transfer.classification.datasets import FashionMNIST

    norm = [T.ToTensor(), T.Normalize(IMAGENET_MEAN_RGB, IMAGENET_STD_RGB)]
    if dataset_type == "fashion_mnist":
        tf = T.Compose(norm)
        return (
            FashionMNIST(root, "train", image_size=size, transform=tf, limit=n_train),
            FashionMNIST(root, "test", image_size=size, transform=tf, limit=n_test),
        )
    # An ImageFolder root has no test split: every 5th image is held out as the test set.
    ds = ImageFolder(root, transform=T.Compose([T.Resize(size), T.CenterCrop(size), *norm]))
    test = list(range(0, len(ds), 5))[:n_test]
    train = [i for i in range(len(ds)) if i % 5][:n_train]
    return Subset(ds, train), Subset(ds, test)


def knn_features(
    backbone: torch.nn.Module,
    root: str,
    size: int,
    n_train: int,
    n_test: int,
    dataset_type: str = "fashion_mnist",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``backbone``'s pooled features and labels of the kNN reference and test images:
    ``(f_train, y_train, f_test, y_test)``."""
    from transfer.classification.features import extract_features

    train, test = _knn_splits(dataset_type, root, size, n_train, n_test)
    f_train, y_train = extract_features(backbone, train, desc="kNN train features")
    f_test, y_test = extract_features(backbone, test, desc="kNN test features")
    return f_train, y_train, f_test, y_test


def knn_top1(
    backbone: torch.nn.Module,
    root: str,
    size: int,
    n_train: int,
    n_test: int,
    dataset_type: str = "fashion_mnist",
) -> float:
    """Weighted kNN (k = 200, T = 0.07) top-1 of ``backbone``'s pooled features."""
    from pretrain.evaluation.knn import knn_accuracy

    f_train, y_train, f_test, y_test = knn_features(
        backbone, root, size, n_train, n_test, dataset_type
    )
    num_classes = int(max(y_train.max(), y_test.max())) + 1
    return knn_accuracy(f_train, y_train, f_test, y_test, num_classes=num_classes)


def run_demo(
    output_dir: str, opts: list[str] | None = None, n_train: int = 10000, n_test: int = 10000
) -> DemoResult:
    """Pretrain with the demo config (resuming if ``output_dir`` has a checkpoint) and evaluate."""
    from detectron2.utils.logger import setup_logger

    from pretrain.engine.trainer import PretrainTrainer

    cfg = load_config(DEMO_CONFIG, ["OUTPUT_DIR", output_dir] + list(opts or []))
    os.makedirs(output_dir, exist_ok=True)
    setup_logger(output_dir, name="pretrain")
    setup_logger(output_dir, name="detectron2")
    start = time.perf_counter()
    trainer = PretrainTrainer(cfg)
    trainer.resume()
    if trainer.start_iter < trainer.max_iter:
        trainer.train()
    seconds = time.perf_counter() - start
    ckpt = os.path.join(output_dir, "model_final.pth")
    pretrained = build_torchvision_backbone(load_backbone(ckpt))
    random_init = build_model(cfg).encoder_q.backbone  # same seed: the run's starting point
    size = cfg.INPUT.LARGE_SIZE
    root = cfg.DATASETS.ROOT
    return DemoResult(
        checkpoint=ckpt,
        knn_pretrained=knn_top1(pretrained, root, size, n_train, n_test, cfg.DATASETS.TYPE),
        knn_random=knn_top1(random_init, root, size, n_train, n_test, cfg.DATASETS.TYPE),
        train_seconds=seconds,
        method="MoCo-M" if cfg.LOSS.PRIOR == "none" else f"LORAC (prior {cfg.LOSS.PRIOR})",
    )
