"""The loader's batches are, bit for bit, those of a plainly written reference data path.

What it proves: decoding JPEGs with torchvision's libjpeg-turbo into tensors, calling the resize
without torchvision's dispatch and collating into one block of (shared) memory change no view, no
colour parameter, no index and no seed. The reference is written out plainly below (PIL decoding
through ``load_image`` or the Fashion-MNIST source's ``load``, ``np.asarray``, torchvision's
``resized_crop`` per view, ``torch.stack`` and ``torch.cat`` collation); it shares with the code
under test only the crop-box and colour-parameter draws, ``to_rgb`` and the in-worker colour path.
Compared on fixed seeds for JPEGs of several encodings, PNGs of several modes, unreadable files and
Fashion-MNIST, with and without a data worker.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image

from pretrain.config.defaults import load_config
from pretrain.data import transforms
from pretrain.data.color import ColorParams, ColorSpec, apply_color_params, sample_color_params
from pretrain.data.datasets import BadImageError, build_source, to_rgb
from pretrain.data.loader import build_pretrain_loader, build_train_transform
from pretrain.data.sampler import IterationBatchSampler
from pretrain.data.transforms import CropSpec, MultiCropTransform, sample_crop_boxes
from pretrain.utils.pixels import to_unit_float
from tests.helpers import ROOT, tiny_opts
from tests.helpers.analysis import make_fashion_mnist
from transfer.classification.demo import DEMO_CONFIG

IN1K = str(ROOT / "configs" / "pretrain" / "in1k_r50_lorac_200ep.yaml")


def _photo(width: int, height: int, seed: int) -> Image.Image:
    """A smooth colour field with edges and grain: JPEG's chroma subsampling has work to do."""
    rng = np.random.default_rng(seed)
    low = Image.fromarray((rng.random((6, 8, 3)) * 255).astype(np.uint8))
    arr = np.asarray(low.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float64)
    arr[height // 3 : height // 2, width // 4 :] = rng.random(3) * 255
    arr += rng.normal(0.0, 6.0, arr.shape)
    return Image.fromarray(arr.clip(0, 255).astype(np.uint8))


def make_mixed_folder(root: Path) -> Path:
    """JPEGs as ImageNet has them and as it rarely has them, PNGs of every mode the loader
    converts, and unreadable files, in two class folders."""
    a, b = root / "a", root / "b"
    a.mkdir(parents=True)
    b.mkdir()
    jpegs = [
        ((120, 90), {"quality": 90}),
        ((90, 120), {"quality": 75, "subsampling": "4:2:2"}),
        ((101, 77), {"quality": 95, "subsampling": "4:4:4"}),
        ((96, 96), {"quality": 85, "progressive": True}),
        ((130, 60), {"quality": 60, "optimize": True, "restart_marker_blocks": 2}),
        ((64, 140), {"quality": 100}),
    ]
    for i, (size, kwargs) in enumerate(jpegs):
        _photo(*size, seed=i).save(a / f"photo{i}.jpg", **kwargs)
    _photo(100, 80, 10).convert("L").save(b / "grey.jpg", quality=90)
    _photo(80, 100, 11).convert("CMYK").save(b / "cmyk.jpg", quality=90)
    _photo(70, 90, 12).save(b / "rgb.png")
    _photo(90, 70, 13).convert("P").save(b / "palette.png")
    _photo(60, 60, 14).convert("RGBA").save(b / "rgba.png")
    grey16 = (np.random.default_rng(15).random((50, 70)) * 65535).astype(np.uint16)
    Image.fromarray(grey16).save(b / "grey16.png")
    buf = io.BytesIO()
    _photo(120, 90, 16).save(buf, "JPEG", quality=90)
    data = buf.getvalue()
    (b / "truncated.jpg").write_bytes(data[: len(data) // 2])
    (b / "zero.jpg").write_bytes(b"")
    (b / "notes.txt").write_text("not an image")
    return root


# ------------------------------------------------------------- the reference data path, plainly


def reference_views(img: Image.Image, transform: MultiCropTransform, g: torch.Generator) -> list:
    """``MultiCropTransform.__call__`` on a PIL image: torchvision's ``resized_crop`` per view."""
    img = to_rgb(img)
    width, height = img.size
    image = torch.from_numpy(np.array(img)).permute(2, 0, 1).unsqueeze(0)
    views = []
    for spec in transform.crops:
        boxes = sample_crop_boxes(width, height, spec.scale, spec.ratio, spec.count, g)
        flips = torch.rand(spec.count, generator=g) < spec.flip_prob
        crops = []
        for box, flip in zip(boxes, flips.tolist(), strict=True):
            out = TF.resized_crop(image, *box, [spec.size, spec.size], antialias=True)[0]
            crops.append((out.flip(-1) if flip else out).contiguous())
        if not transform.color_on_device:  # colour in the worker, rounded back to uint8 once
            x = torch.stack(crops)
            params = sample_color_params(x.shape[0], transform.color, g)
            y = apply_color_params(to_unit_float(x), params, transform.color)
            crops = y.mul_(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8).unbind(0)
        views.extend(crops)
    return views


def reference_item(source, transform, color, index: int, seed: int, iteration: int) -> dict:
    """``PretrainDataset.__getitem__`` with PIL images from ``source.load``."""
    skipped = []
    for attempt in range(64):
        j = (index + attempt) % len(source)
        try:
            img = source.load(j)
        except BadImageError as e:
            skipped.append(str(e))
            continue
        g = torch.Generator().manual_seed(seed)
        views = reference_views(img, transform, g)
        params = sample_color_params(len(views), color, g) if color else None
        return {"views": views, "color": params, "index": j, "seed": seed,
                "iteration": iteration, "skipped_files": skipped}  # fmt: skip
    raise AssertionError("no readable image")


def reference_collate(batch: list[dict]) -> dict:
    """``collate_views`` by ``torch.stack`` and ``torch.cat`` (without the ShuffleBN plans, which
    this comparison leaves out)."""
    n_views = len(batch[0]["views"])
    color = None
    if batch[0]["color"] is not None:
        names = list(batch[0]["color"].tensors)
        color = [
            ColorParams(
                len(batch),
                {f: torch.cat([b["color"][v : v + 1].tensors[f] for b in batch]) for f in names},
            )
            for v in range(n_views)
        ]
    return {
        "color_params": color,
        "views": [torch.stack([b["views"][v] for b in batch]) for v in range(n_views)],
        "index": torch.tensor([b["index"] for b in batch]),
        "seeds": torch.tensor([b["seed"] for b in batch]),
        "skipped_files": [p for b in batch for p in b["skipped_files"]],
    }


# ------------------------------------------------------------------ the comparisons


def assert_same_batch(got: dict, ref: dict) -> None:
    assert len(got["views"]) == len(ref["views"])
    for g, r in zip(got["views"], ref["views"], strict=True):
        assert g.dtype == r.dtype == torch.uint8 and g.shape == r.shape
        assert torch.equal(g, r)
    for key in ("index", "seeds"):
        assert got[key].dtype == ref[key].dtype and torch.equal(got[key], ref[key]), key
    assert got["skipped_files"] == ref["skipped_files"]
    if ref["color_params"] is None:
        assert got["color_params"] is None
        return
    for g, r in zip(got["color_params"], ref["color_params"], strict=True):
        assert list(g.tensors) == list(r.tensors)
        for f, a in g.tensors.items():
            b = r.tensors[f]
            assert a.dtype == b.dtype and torch.equal(a, b), f


def check_loader(cfg, iters: int = 4, start_iter: int = 2) -> int:
    """Compare ``iters`` batches of the trainer's loader with the reference; returns the number
    of unreadable files the batches skipped (so that a test can say it met some)."""
    source = build_source(cfg, "train")
    transform, color = build_train_transform(cfg)
    color = color if cfg.INPUT.COLOR_ON_DEVICE else None
    batch = cfg.SOLVER.IMS_PER_BATCH
    sampler = iter(IterationBatchSampler(len(source), batch, 0, 1, cfg.SEED, start_iter))
    loader = iter(build_pretrain_loader(cfg, 0, 1, start_iter, source, procs_on_machine=1))
    skipped = 0
    for it in range(start_iter, start_iter + iters):
        items = next(sampler)
        ref = reference_collate([reference_item(source, transform, color, i, s, it)
                                 for i, s in items])  # fmt: skip
        got = next(loader)
        assert got["iteration"] == it
        assert_same_batch(got, ref)
        skipped += len(ref["skipped_files"])
    return skipped


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("color_on_device", [True, False])
def test_multicrop_batches_of_jpegs_and_pngs_are_unchanged(tmp_path, workers, color_on_device):
    """The IN-1K multi-crop recipe (smaller views) on the mixed folder: 14 images, 8 per batch,
    so each file (the unreadable ones too) turns up within the 4 iterations."""
    root = make_mixed_folder(tmp_path / "data")
    opts = {"DATALOADER.NUM_WORKERS": workers, "INPUT.COLOR_ON_DEVICE": color_on_device,
            "INPUT.LARGE_SIZE": 48, "INPUT.SMALL_SIZE": 24, "SEED": 3,
            "MODEL.DEVICE": "cpu"}  # fmt: skip
    cfg = load_config(IN1K, tiny_opts(root, tmp_path / "out", **opts))
    assert (cfg.INPUT.LARGE_CROPS, cfg.INPUT.SMALL_CROPS) == (3, 5)
    assert check_loader(cfg) > 0  # some batches met unreadable files and skipped them


@pytest.mark.parametrize("workers", [0, 1])
def test_fashion_mnist_batches_are_unchanged(tmp_path, workers):
    """The demo's recipe and data (``make demo`` must print the same figures)."""
    data = make_fashion_mnist(tmp_path / "fmnist", n_train=32, n_test=4)
    opts = tiny_opts(data, tmp_path / "out", **{"DATALOADER.NUM_WORKERS": workers})
    cfg = load_config(DEMO_CONFIG, [*opts, "DATASETS.TYPE", "fashion_mnist", "INPUT.LARGE_SIZE",
                                    "24"])  # fmt: skip
    check_loader(cfg)


@pytest.mark.parametrize(
    "box, size",
    [
        ((0, 0, 90, 120), 48),  # the whole image
        ((10, 0, 40, 120), 48),  # full width: channels-last, restrided like torchvision does
        ((5, 7, 48, 48), 48),  # already the target size: no resize
        ((30, 11, 1, 57), 24),  # one row
        ((3, 50, 80, 2), 24),  # two columns: upscaled
        ((20, 30, 33, 41), 48),
    ],
)
@pytest.mark.parametrize("flip", [False, True])
def test_crop_resize_is_torchvision_resized_crop(box, size, flip, monkeypatch):
    """A view of ``box`` (the crop-box draw fixed to it), flipped or not, is torchvision's
    ``resized_crop`` of the image, bit for bit."""
    hwc = torch.from_numpy(np.array(_photo(120, 90, 1)))
    image = hwc.permute(2, 0, 1).unsqueeze(0)
    ref = TF.resized_crop(image, *box, [size, size], antialias=True)[0]
    ref = (ref.flip(-1) if flip else ref).contiguous()
    monkeypatch.setattr(transforms, "sample_crop_boxes", lambda *args: [box])
    spec = CropSpec(size=size, scale=(0.5, 1.0), count=1, flip_prob=float(flip))
    (out,) = MultiCropTransform([spec], ColorSpec())(hwc, torch.Generator().manual_seed(0))
    assert out.is_contiguous() and out.shape == (3, size, size)
    assert torch.equal(out, ref)
