"""The `make demo` job: LORAC on Fashion-MNIST, then kNN top-1 beside raw pixels and random init."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from fvcore.common.config import CfgNode
from torch.utils.data import Dataset
from torchvision import transforms as T

from pretrain.config import load_config
from pretrain.config.strict import check_override_pairs
from pretrain.data.datasets import (
    FASHION_MNIST,
    ImageFolderSource,
    TransformedDataset,
    readable_loader,
)
from pretrain.data.splits import evenly_spaced, labelled_splits
from pretrain.evaluation.features import extract_features
from pretrain.evaluation.knn import KNN_K, KNN_T, knn_accuracy, knn_top1
from pretrain.losses.priors import PRIOR_REGISTRY
from pretrain.modeling import build_model
from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
from pretrain.utils.errors import ConfigError, DatasetError
from pretrain.utils.output_dir import check_output_dir
from pretrain.utils.run_owner import PRETRAINING
from transfer.checkpoint.reader import build_torchvision_backbone, load_backbone
from transfer.classification.datasets import labelled_sets
from transfer.run_dir import RunDir
from transfer.shipped_configs import config_path

__all__ = [
    "DEMO_CONFIG",
    "DemoResult",
    "centred_pixels",
    "demo_folder_layout",
    "format_knn_report",
    "format_training_summary",
    "knn_features",
    "method_label",
    "raw_pixel_top1",
    "run_demo",
    "save_knn_table",
]

DEMO_CONFIG = config_path("pretrain/demo_fashion_mnist_r18.yaml")
logger = logging.getLogger(__name__)


@dataclass
class DemoResult:
    checkpoint: str
    knn_pretrained: float
    knn_random: float
    train_seconds: float
    method: str = "LORAC"
    knn_raw_pixels: float = float("nan")
    stem: str = "imagenet"
    iterations: int = 0
    header: str = ""
    start_iteration: int = 0  # where this invocation started (a resumed run: > 0)


def format_training_summary(res: DemoResult) -> str:
    """What this invocation trained and in what time, and what was done before it: a resumed
    run's earlier iterations are not counted against this run's minutes."""
    total, before = res.iterations, res.start_iteration
    if before >= total:
        return f"pretraining: already finished ({total} iterations), nothing trained this time"
    minutes = f"{res.train_seconds / 60:.1f} min"
    if before == 0:
        return f"pretraining: {total} iterations in {minutes}"
    return (
        f"pretraining: {total - before} of {total} iterations in {minutes} ({before} done before)"
    )


def method_label(cfg: CfgNode) -> str:
    """The name the demo prints for the method ``cfg`` trains: LORAC, MoCo-M or MoCo-v2."""
    inp, loss = cfg.INPUT, cfg.LOSS
    if PRIOR_REGISTRY.get(loss.PRIOR).enabled and math.isfinite(float(loss.BETA)):
        return "LORAC"
    if inp.LARGE_CROPS == 2 and inp.SMALL_CROPS == 0 and inp.KEY_CROPS == 1:
        return "MoCo-v2"
    return "MoCo-M"


def format_knn_report(res: DemoResult) -> str:
    """The four lines the demo ends with (see docs/demo.md)."""
    rows = [("raw pixels", res.knn_raw_pixels), ("random init", res.knn_random)]
    rows.append((res.method, res.knn_pretrained))
    return "\n".join([res.header] + [f"  {name:<15}{100 * acc:.2f} %" for name, acc in rows])


def save_knn_table(res: DemoResult, output_dir: str, cfg: CfgNode | None = None) -> str:
    """The kNN table kept with the run: ``results.json`` (each row's top-1, k, T, the header
    saying which images) and its lines in ``log.txt``; returns the results file's path."""
    rows = {"raw pixels": res.knn_raw_pixels, "random init": res.knn_random}
    rows[res.method] = res.knn_pretrained
    results = {"knn_top1": rows, "k": KNN_K, "T": KNN_T, "header": res.header}
    path = RunDir(output_dir).write_results(
        results, cfg, checkpoint=res.checkpoint, method=res.method, iterations=res.iterations
    )
    for line in format_knn_report(res).splitlines():
        logger.info(line)
    return path


SPLIT_ROOT, CLASS_ROOT = "train/ and val/", "class folders"  # demo_folder_layout's answers


def demo_folder_layout(root: str) -> str:
    """:data:`SPLIT_ROOT` for ``root/train`` and ``root/val`` class folders, :data:`CLASS_ROOT`
    for class folders directly in ``root``; anything between the two is a :class:`DatasetError`
    (the demo would otherwise report kNN on "classes" named train and val)."""
    if not os.path.isdir(root):
        raise DatasetError(f"DATASETS.ROOT = {root!r}: no such directory")
    folders = sorted(
        d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and d[0] != "."
    )
    splits = [d for d in ("train", "val") if d in folders]
    if not splits:
        return CLASS_ROOT
    others = [d for d in folders if d not in splits]
    if len(splits) == 2 and not others:
        return SPLIT_ROOT
    problem = (
        f"has {splits[0]}/ but no {'val' if splits[0] == 'train' else 'train'}/"
        if len(splits) == 1
        else f"has train/ and val/ beside other folders ({', '.join(others[:3])})"
    )
    raise DatasetError(
        f"DATASETS.ROOT = {root!r}: {problem}; give a root holding only train/ and val/ class "
        "folders (as the evaluation tools' --data-root), or a folder of class folders (every 5th "
        "image is then held out for the kNN)"
    )


def _knn_splits(
    dataset_type: str,
    root: str,
    size: int,
    n_train: int,
    n_test: int,
    norm: Sequence[Callable] | None = None,
) -> tuple[Dataset, Dataset]:
    """(reference, test) datasets of (tensor, label) for the demo's kNN: Fashion-MNIST's first
    ``n_train`` / ``n_test`` images; with ``train/`` and ``val/``, images evenly spaced over each
    (every class keeps some); with class folders only, every 5th image as the test set. ``norm``
    (default: ToTensor + ImageNet normalisation) follows the resize to ``size``."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    if norm is None:
        norm = [T.ToTensor(), T.Normalize(IMAGENET_MEAN_RGB, IMAGENET_STD_RGB)]
    if dataset_type == FASHION_MNIST:
        tf = T.Compose(norm)
        return labelled_splits(
            FASHION_MNIST, root, limits=(n_train, n_test), image_size=size, transform=tf
        )
    tf = T.Compose([T.Resize(size), T.CenterCrop(size), *norm])
    if demo_folder_layout(root) == SPLIT_ROOT:
        train_ds, test_ds, _ = labelled_sets(dataset_type, root)
        return (
            TransformedDataset(train_ds, tf, evenly_spaced(len(train_ds), n_train)),
            TransformedDataset(test_ds, tf, evenly_spaced(len(test_ds), n_test)),
        )
    ds = ImageFolderSource(root, extensions=IMG_EXTENSIONS, allow_empty=False)
    test = list(range(0, len(ds), 5))[:n_test]
    train = [i for i in range(len(ds)) if i % 5][:n_train]
    return TransformedDataset(ds, tf, train), TransformedDataset(ds, tf, test)


def knn_features(
    backbone: torch.nn.Module,
    root: str,
    size: int,
    n_train: int,
    n_test: int,
    dataset_type: str = FASHION_MNIST,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``backbone``'s pooled features and labels of the kNN reference and test images:
    ``(f_train, y_train, f_test, y_test)``."""
    train, test = _knn_splits(dataset_type, root, size, n_train, n_test)
    f_train, y_train = extract_features(backbone, train, desc="kNN train features")
    f_test, y_test = extract_features(backbone, test, desc="kNN test features")
    return f_train, y_train, f_test, y_test


def centred_pixels(train: torch.Tensor, test: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (N, ...) as flat vectors minus the mean reference (``train``) vector.

    Centring matters for the cosine kNN: raw pixels are all positive, so every pair of images
    has a large similarity from the shared background; measured on Fashion-MNIST (10,000
    references) 73.4 % uncentred vs 79.6 % centred.
    """
    flat_train, flat_test = train.flatten(1).float(), test.flatten(1).float()
    mean = flat_train.mean(0, keepdim=True)
    return flat_train - mean, flat_test - mean


def _stack(ds: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
    """Every readable image of ``ds`` and its label (an unreadable one skipped, as the kNN of
    the learned features skips it)."""
    batches = [b for b in readable_loader(ds, batch_size=256) if b is not None]
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def raw_pixel_top1(
    root: str, n_train: int, n_test: int, dataset_type: str = FASHION_MNIST, size: int = 28
) -> float:
    """The same weighted kNN on grey ``size`` px images (28: Fashion-MNIST's own) as centred
    vectors: the baseline a learned representation has to beat."""
    train, test = _knn_splits(
        dataset_type, root, size, n_train, n_test, [T.Grayscale(), T.ToTensor()]
    )
    x_train, y_train = _stack(train)
    x_test, y_test = _stack(test)
    f_train, f_test = centred_pixels(x_train, x_test)
    return knn_accuracy(f_train, y_train, f_test, y_test)


def _header(dataset_type: str, root: str, n_train: int, n_test: int) -> str:
    """The report's first line, with the numbers of images the kNN really used."""
    if dataset_type == FASHION_MNIST:
        where = "the Fashion-MNIST test split"
        if n_test < 10000:
            where = f"the first {n_test:,} images of the Fashion-MNIST test split"
    elif demo_folder_layout(root) == SPLIT_ROOT:
        where = f"{n_test:,} images of {os.path.join(root, 'val')}"
    else:
        where = f"{n_test:,} held-out images of {root}"
    return f"kNN top-1 on {where} (k = {KNN_K}, T = {KNN_T}, {n_train:,} references):"


def _demo_config(output_dir: str, opts: Sequence[str]) -> tuple[CfgNode, str]:
    """The demo config with ``opts`` and the root of its labelled images: ``DATASETS.ROOT``,
    whose ``train/`` is what pretraining reads when it has ``train/`` and ``val/``."""
    check_override_pairs(opts)  # before OUTPUT_DIR is added: the message lists the user's only
    base = ["OUTPUT_DIR", output_dir, *opts]
    cfg = load_config(DEMO_CONFIG, base)
    root = cfg.DATASETS.ROOT
    if cfg.DATASETS.TYPE != FASHION_MNIST and demo_folder_layout(root) == SPLIT_ROOT:
        # pretraining never sees val/ (the kNN's queries); config.yaml says what it read
        cfg = load_config(DEMO_CONFIG, [*base, "DATASETS.ROOT", os.path.join(root, "train")])
    return cfg, root


def run_demo(
    output_dir: str, opts: list[str] | None = None, n_train: int = 10000, n_test: int = 10000
) -> DemoResult:
    """Pretrain with the demo config (resuming; Ctrl-C saves a checkpoint and exits 130) and
    evaluate; the output directory and both kNN sets are checked before anything is written."""
    from detectron2.utils.logger import setup_logger

    from pretrain.engine.run import run_pretraining

    if n_train < 1 or n_test < 1:
        raise ConfigError(f"--knn-train and --knn-test must be >= 1, got {n_train} and {n_test}")
    check_output_dir(output_dir, "--output-dir", owner=PRETRAINING)  # another tool's: refused
    cfg, root = _demo_config(output_dir, list(opts or []))
    kind, size = cfg.DATASETS.TYPE, cfg.INPUT.LARGE_SIZE
    train, test = _knn_splits(kind, root, size, n_train, n_test)
    os.makedirs(output_dir, exist_ok=True)
    setup_logger(output_dir, name="pretrain")
    setup_logger(output_dir, name="detectron2")
    # this module's lines (the kNN table) into log.txt only: the tool prints the table itself
    setup_logger(output_dir, name=__name__, abbrev_name="demo", configure_stdout=False)
    start = time.perf_counter()
    trainer = run_pretraining(cfg, stop_on_interrupt=True)
    seconds = time.perf_counter() - start
    ckpt = os.path.join(output_dir, "model_final.pth")
    weights = load_backbone(ckpt)
    pretrained = build_torchvision_backbone(weights)
    random_init = build_model(cfg).encoder_q.backbone  # same seed: the run's starting point
    raw_size = 28 if kind == FASHION_MNIST else size
    res = DemoResult(
        checkpoint=ckpt,
        knn_pretrained=knn_top1(pretrained, train, test),
        knn_random=knn_top1(random_init, train, test),
        train_seconds=seconds,
        method=method_label(cfg),
        knn_raw_pixels=raw_pixel_top1(root, n_train, n_test, kind, raw_size),
        stem=weights.stem,
        iterations=trainer.max_iter,
        start_iteration=trainer.start_iter,
        header=_header(kind, root, len(train), len(test)),
    )
    save_knn_table(res, output_dir, cfg)
    return res
