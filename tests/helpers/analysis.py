"""Helpers for the analysis tests: tiny pretrained runs written to disk, PNG checks.

No tests here; the tests under ``tests/transfer/analysis/`` and others import these from
``tests.helpers.analysis``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pretrain.config import load_config
from pretrain.modeling import build_model
from tests.helpers import tiny_opts
from transfer.classification.demo import DEMO_CONFIG
from transfer.study import METHODS, StudyOptions

TINY = {
    "DATASETS.TYPE": "imagefolder",
    "MODEL.DEVICE": "cpu",
    "MODEL.QUEUE_SIZE": 16,
    "MODEL.HEAD_HIDDEN_DIM": 32,
    "MODEL.HEAD_OUT_DIM": 16,
    "INPUT.LARGE_SIZE": 16,
    "INPUT.SMALL_SIZE": 16,
    "SOLVER.IMS_PER_BATCH": 8,
    # float32: CPU bfloat16 at 16 px is refused (pretrain.engine.launch.check_cpu_bfloat16)
    "SOLVER.AMP.ENABLED": False,
}


def tiny_cfg(root: Path, out: Path, **extra):
    opts = {**TINY, "DATASETS.ROOT": str(root), "OUTPUT_DIR": str(out), **extra}
    return load_config(DEMO_CONFIG, [str(x) for kv in opts.items() for x in kv])


def make_run(
    out: Path, root: Path, seed: int, checkpoint: str = "model_final.pth", **extra
) -> Path:
    """A run folder as the trainer leaves it: config.yaml, a checkpoint (randomly initialised
    tiny ResNet-18, distinct per seed), last_checkpoint and a short fake metrics.json."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = tiny_cfg(root, out, SEED=seed, **extra)
    torch.save({"model": build_model(cfg).state_dict()}, out / checkpoint)
    (out / "last_checkpoint").write_text(checkpoint)
    (out / "config.yaml").write_text(cfg.dump())
    beta = math.inf if cfg.LOSS.PRIOR == "none" else float(cfg.LOSS.BETA)
    write_metrics(out / "metrics.json", beta, offset=0.1 * seed)
    return out


def write_metrics(path: Path, beta: float, offset: float = 0.0, iters: int = 12) -> None:
    """JSONWriter-like lines; beta is inf (prior off) for the first half, as in the schedules;
    kNN (and its collapse diagnostics) every 4 iterations. The trainer logs nuclear_norm 0
    while the prior is off."""
    with open(path, "w") as f:
        for it in range(iters):
            b = math.inf if it < iters // 2 else beta
            rec = {
                "iteration": it,
                "total_loss": 6.0 - 0.1 * it + offset,
                "nuclear_norm": 0.0 if math.isinf(b) else 1.6 - 0.01 * it,
                "inst_acc": 0.05 * it,
                "lr": 0.5 * (1 - it / iters),
                "beta": b,
                "images_per_sec": 50.0 + offset,
                "data_time": 0.01,
            }
            if it % 4 == 3:  # with the monitor's collapse diagnostics
                rec["knn/top1"] = 0.3 + 0.02 * it
                rec.update({"knn/effective_rank": 20.0 + it, "knn/std": 0.01, "knn/std_ratio": 0.4,
                            "knn/alignment": 0.5, "knn/uniformity": -2.0})  # fmt: skip
            f.write(json.dumps(rec) + "\n")  # json writes inf as Infinity, like the trainer


def assert_png_not_blank(path: Path | str) -> None:
    """The file decodes as an image with real content (more than one colour, some ink)."""
    with Image.open(path) as img:
        img.load()
        arr = np.asarray(img.convert("L"), dtype=float)
    assert arr.size > 100 * 100, path
    assert arr.std() > 1.0, f"{path}: a single colour"
    assert (arr < 128).mean() > 0.002, f"{path}: almost no dark pixels (nothing drawn?)"


def make_fashion_mnist(root: Path, n_train: int = 20, n_test: int = 10) -> Path:
    """Gzipped idx files in Fashion-MNIST's layout: 28x28 grey images, classes 0-9 cycling."""
    import gzip
    import struct

    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        images = rng.integers(0, 60, (n, 28, 28))
        for i, c in enumerate(labels):
            images[i, 2 * c : 2 * c + 6, :] = 255  # a class-dependent bright band
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
            with gzip.open(root / f"{prefix}-{kind}-ubyte.gz", "wb") as f:
                f.write(header + arr.astype(np.uint8).tobytes())
    return root


def make_symmetric_folder(root: Path, size: int = 16, per_class: int = 2) -> Path:
    """Left-right mirror-symmetric square images: a horizontal flip leaves them unchanged."""
    rng = np.random.default_rng(1)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            half = rng.integers(0, 256, (size, size // 2, 3), dtype=np.uint8)
            img = np.concatenate([half, half[:, ::-1]], axis=1)
            Image.fromarray(img).save(root / f"c{c}" / f"img{i}.png")
    return root


def exit_status(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """What a shell sees from a tool: ``main``'s return value, or the status of its SystemExit."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def study_record(method, label, seed, knn, nuc, **extra):
    """A study run's record (its study.json, as ``tools/study.py --records`` keeps it) with the
    given kNN (linear = kNN + 1) and test nuclear norm."""
    return {
        "method": method, "label": label, "seed": seed, "knn_top1": knn, "linear_top1": knn + 1,
        "nuclear_mean": nuc, "nuclear_std": 0.1, "train_seconds": 60.0, "images_per_sec": 100.0,
        "eval_seconds": 10.0, "resumed_from_iter": 0, "max_iter": 10, "ims_per_batch": 8,
        "train_images": 40, "epochs": 2.0, "views": 3, "probe_train_images": 40,
        "probe_test_images": 20, **extra,
    }  # fmt: skip


def study_options(root: Path, out: Path, results: Path, **kw) -> StudyOptions:
    """A study of the three methods at test size: two iterations, 40 kNN references, 4 images
    of the nuclear norm; ``overrides``, ``seeds`` and ``methods`` as keywords."""
    overrides = {"DATASETS.TYPE": "fashion_mnist", "INPUT.LARGE_SIZE": 16, "SOLVER.MAX_ITER": 2}
    opts = tiny_opts(root, out, **{**overrides, **kw.pop("overrides", {})})
    return StudyOptions(
        output_dir=str(out),
        results=str(results),
        seeds=kw.pop("seeds", (0, 1)),
        methods=kw.pop("methods", tuple(METHODS)),
        knn_train=40,
        knn_test=20,
        nuclear_images=4,
        probe_epochs=2,
        probe_heldout_per_class=1,
        opts=opts,
        command="python tools/study.py (test)",
    )
