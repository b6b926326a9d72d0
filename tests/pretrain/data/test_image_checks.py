"""The one check of image files (``pretrain.data.datasets.open_image``), for pretraining and every
evaluation: an image over ``PIL.Image.MAX_IMAGE_PIXELS`` is refused before any decode (a real
200-megapixel PNG is a ``BadImageError``, never PIL's ``DecompressionBombError``), zero-byte and
non-image files are ``BadImageError`` too; pretraining skips and counts them, the evaluations'
loaders leave them out of their batches with a warning each and a count, files without an image
suffix are left out and counted in one line a console shows, and the pretraining kNN monitor
goes on past them."""

from __future__ import annotations

import logging
import struct
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from PIL import Image
from torchvision.transforms import v2 as T

from pretrain.config.defaults import load_config
from pretrain.data.datasets import (
    BadImageError,
    ImageFilesSource,
    ImageFolderSource,
    TransformedDataset,
    load_image,
    load_rgb,
    readable_loader,
)
from pretrain.data.loader import PretrainDataset, build_train_transform
from pretrain.evaluation.features import extract_features
from pretrain.evaluation.knn_monitor import build_knn_hook
from tests.helpers import make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_grey_png(path: Path, width: int, height: int) -> Path:
    """A valid, uniformly black 8-bit greyscale PNG of ``width`` x ``height``, written without
    holding its pixels (a 200-megapixel one is 190 KB on disk, made in well under a second)."""
    z = zlib.compressobj(1)
    rows = bytes(width + 1) * 1000  # filter byte 0 and a black row, 1000 rows at a time
    parts = [z.compress(rows) for _ in range(height // 1000)]
    parts += [z.compress(bytes(width + 1) * (height % 1000)), z.flush()]
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + _chunk(b"IDAT", b"".join(parts))
        + _chunk(b"IEND", b"")
    )
    return path


@pytest.fixture(scope="module")
def huge_png(tmp_path_factory) -> Path:
    return write_grey_png(tmp_path_factory.mktemp("huge") / "panorama.png", 20000, 10000)


def test_a_200_megapixel_png_is_a_bad_image_over_the_pixel_limit_not_a_decompression_bomb(
    huge_png,
):
    for read in (load_image, load_rgb):
        with pytest.raises(BadImageError, match=r"more than 89,478,485 pixels.*MAX_IMAGE_PIXELS"):
            read(str(huge_png))


def test_an_image_over_the_limit_is_refused_without_decoding_or_a_pil_warning(
    tmp_path, monkeypatch
):
    """PIL.Image.MAX_IMAGE_PIXELS is the limit (here lowered): just over it, PIL alone would warn
    and decode; the check refuses, for JPEGs (torchvision's decoder) and PNGs alike."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    for name in ("a.jpg", "a.png"):
        Image.new("RGB", (11, 10), (9, 90, 200)).save(tmp_path / name)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for read in (load_image, load_rgb):
                with pytest.raises(BadImageError, match=r"11x10 = 110 pixels, more than 100"):
                    read(str(tmp_path / name))
    Image.new("RGB", (10, 10)).save(tmp_path / "ok.png")
    assert load_image(str(tmp_path / "ok.png")).size == (10, 10)  # at the limit: decoded


def test_pretraining_skips_and_counts_the_200_megapixel_image(tmp_path, huge_png):
    root = make_image_folder(tmp_path / "photos", classes=1, per_class=2, size=16)
    (root / "class0" / "img0.png").write_bytes(huge_png.read_bytes())
    (root / "class0" / "empty.jpg").write_bytes(b"")
    cfg = load_config(DEMO_CONFIG, tiny_opts(root, tmp_path / "run"))
    data = PretrainDataset(ImageFolderSource(str(root)), build_train_transform(cfg)[0])
    item = data[(0, 0, 0)]  # empty.jpg, then img0.png: both skipped, img1.jpg loaded
    assert item["index"] == 2 and [s.split(":")[0] for s in item["skipped_files"]] == [
        str(root / "class0" / "empty.jpg"),
        str(root / "class0" / "img0.png"),
    ]


def test_files_without_an_image_suffix_are_counted_in_one_line_a_console_shows(tmp_path, caplog):
    """The line docs/pretraining.md promises is a warning: Python's default handler prints it
    before a tool has set up its logging (as pretraining scans its data before it writes)."""
    photos = make_image_folder(tmp_path / "photos", classes=2, per_class=1, size=16)
    (photos / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
    (photos / "class0" / "notes.txt").write_text("a sidecar")
    with caplog.at_level(logging.WARNING, logger="pretrain.data.datasets"):
        assert len(ImageFilesSource(str(photos))) == 2
        assert len(ImageFolderSource(str(photos), extensions=(".png", ".jpg"))) == 2
    assert caplog.messages == [
        f"{photos}: 2 files without an image suffix left out (1 .db, 1 .txt)",
        f"{photos}: 1 files without an image suffix left out (1 .txt)",
    ]


def test_an_evaluation_loader_leaves_out_unreadable_images_with_a_warning_and_a_count(
    tmp_path, caplog
):
    root = make_image_folder(tmp_path / "val", classes=2, per_class=2, size=16)
    (root / "class0" / "zero.jpg").write_bytes(b"")
    (root / "class1" / "Thumbs.jpg").write_bytes(b"\xd0\xcf\x11\xe0 not an image")
    data = TransformedDataset(ImageFolderSource(str(root)), T.Compose([T.PILToTensor()]))
    with caplog.at_level(logging.WARNING):
        feats, labels = extract_features(lambda x: x.float().mean((2, 3)), data, batch_size=2)
    assert labels.tolist() == [0, 0, 1, 1] and feats.shape == (4, 3)
    skipped = [m for m in caplog.messages if m.startswith("skipped unreadable image: ")]
    assert len(skipped) == 2 and "zero-byte file" in skipped[-1] + skipped[0]
    assert "features: 2 of 6 images skipped as unreadable" in caplog.messages
    only_bad = readable_loader(torch.utils.data.Subset(data, [2]), batch_size=1)  # zero.jpg
    assert list(only_bad) == [None]


class _Pixels(torch.nn.Module):
    """A stand-in pretraining model: mean colour features, on the CPU."""

    device = torch.device("cpu")

    def backbone_features(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().mean((2, 3))


def test_the_pretraining_knn_monitor_goes_on_past_a_zero_byte_image_and_a_thumbs_db(tmp_path):
    root = tmp_path / "knn"
    for split in ("train", "val"):
        make_image_folder(root / split, classes=2, per_class=3, size=16)
        (root / split / "class0" / "broken.png").write_bytes(b"")
        (root / split / "class1" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
    opts = tiny_opts(root / "train", tmp_path / "run", **{"TEST.KNN_ROOT": str(root),
                     "TEST.KNN_PERIOD": 1, "TEST.KNN_BATCH_SIZE": 2})  # fmt: skip
    hook = build_knn_hook(load_config(DEMO_CONFIG, opts), _Pixels())
    assert 0.0 <= hook.compute() <= 1.0
    assert hook.last_counts == (6, 6)  # the zero-byte images skipped, Thumbs.db left out


def test_the_left_out_line_is_the_one_docs_pretraining_md_shows():
    from collections import Counter

    from pretrain.data.datasets import left_out_line
    from tests.helpers import ROOT

    page = " ".join((ROOT / "docs" / "pretraining.md").read_text().split())
    shown = left_out_line("<root>", Counter({".aae": 2, ".db": 1}))
    assert f"(`{shown}`)" in page
