"""``load_rgb``: the pretraining workers' decoder gives ``load_image``'s pixels and errors.

Plain JPEGs go through torchvision's libjpeg-turbo (``decode_jpeg``), everything else through
PIL. Checked here: the same pixels for every JPEG encoding ImageNet-like data uses (and some it
rarely does), for PNGs of every mode, for a JPEG with corrupt data that both decoders accept;
the same :class:`BadImageError` for files either one refuses; that plain JPEGs really take the
torchvision path; and that a build whose decoder differs from PIL's decodes with PIL only.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
import torchvision.io
from PIL import Image, JpegImagePlugin

from pretrain.data import datasets
from pretrain.data.datasets import (
    BadImageError,
    FashionMNISTSource,
    ImageFolderSource,
    load_image,
    load_rgb,
)
from tests.helpers.analysis import make_fashion_mnist


def _photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A smooth colour field with a sharp band and grain."""
    rng = np.random.default_rng(seed)
    low = Image.fromarray((rng.random((5, 7, 3)) * 255).astype(np.uint8))
    arr = np.asarray(low.resize((width, height), Image.Resampling.BICUBIC), dtype=np.float64)
    arr[: height // 2, width // 3 : width // 2] = rng.random(3) * 255
    arr += rng.normal(0.0, 8.0, arr.shape)
    return Image.fromarray(arr.clip(0, 255).astype(np.uint8))


def _jpeg_bytes(img: Image.Image, **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", **kwargs)
    return buf.getvalue()


@pytest.fixture
def no_cached_probe():
    """Tests that change the decoders see a fresh probe, and leave a fresh one behind."""
    datasets.turbo_matches_pil.cache_clear()
    yield
    datasets.turbo_matches_pil.cache_clear()


JPEG_CASES = {
    "420_q90": ((500, 375), {"quality": 90}),
    "420_odd": ((333, 251), {"quality": 90, "subsampling": "4:2:0"}),
    "422_q75": ((375, 500), {"quality": 75, "subsampling": "4:2:2"}),
    "444_q95": ((101, 77), {"quality": 95, "subsampling": "4:4:4"}),
    "progressive": ((320, 240), {"quality": 85, "progressive": True}),
    "progressive_444": ((99, 131), {"quality": 85, "progressive": True, "subsampling": "4:4:4"}),
    "optimized_q50": ((200, 150), {"quality": 50, "optimize": True}),
    "restart_markers": ((160, 120), {"quality": 90, "restart_marker_blocks": 3}),
    "q100": ((64, 48), {"quality": 100}),
    "one_row": ((17, 1), {"quality": 90}),
    "one_column": ((1, 19), {"quality": 90}),
}


@pytest.mark.parametrize("case", sorted(JPEG_CASES))
def test_jpegs_decode_to_pils_pixels(tmp_path, case):
    size, kwargs = JPEG_CASES[case]
    path = tmp_path / "x.jpg"
    path.write_bytes(_jpeg_bytes(_photo(*size), **kwargs))
    got = load_rgb(str(path))
    assert got.dtype == torch.uint8 and got.shape == (size[1], size[0], 3)
    assert got.is_contiguous()
    assert torch.equal(got, torch.from_numpy(np.array(load_image(str(path)))))


@pytest.mark.parametrize("mode", ["L", "CMYK", "RGB_PNG", "P_PNG", "RGBA_PNG", "LA_PNG", "I16_PNG"])
def test_other_images_decode_to_pils_pixels(tmp_path, mode):
    """Grey and CMYK JPEGs and PNGs go through PIL, converted to RGB as before."""
    img = _photo(90, 70, seed=2)
    if mode in ("L", "CMYK"):
        path = tmp_path / "x.jpg"
        img.convert(mode).save(path, quality=90)
    elif mode == "I16_PNG":
        path = tmp_path / "x.png"
        arr = (np.random.default_rng(0).random((70, 90)) * 65535).astype(np.uint16)
        Image.fromarray(arr).save(path)
    else:
        path = tmp_path / "x.png"
        img.convert(mode.removesuffix("_PNG")).save(path)
    got = load_rgb(str(path))
    assert got.shape == (70, 90, 3) and got.dtype == torch.uint8
    assert torch.equal(got, torch.from_numpy(np.array(load_image(str(path)))))


def test_corrupt_jpeg_data_that_both_accept_decodes_alike(tmp_path):
    """Zeros in the middle of the entropy-coded data: libjpeg warns and carries on in both."""
    data = _jpeg_bytes(_photo(500, 375), quality=90)
    mid = len(data) // 2
    path = tmp_path / "corrupt.jpg"
    path.write_bytes(data[:mid] + b"\x00" * 50 + data[mid + 50 :])
    assert torch.equal(load_rgb(str(path)), torch.from_numpy(np.array(load_image(str(path)))))


@pytest.mark.parametrize("kind", ["truncated", "header_only", "zero_bytes", "not_an_image"])
def test_unreadable_files_raise_load_images_error(tmp_path, kind):
    data = _jpeg_bytes(_photo(120, 90), quality=90)
    content = {
        "truncated": data[: len(data) // 2],
        "header_only": data[:200],
        "zero_bytes": b"",
        "not_an_image": b"hello " * 100,
    }[kind]
    path = tmp_path / "bad.jpg"
    path.write_bytes(content)
    with pytest.raises(BadImageError) as expected:
        load_image(str(path))
    with pytest.raises(BadImageError) as got:
        load_rgb(str(path))
    assert str(got.value) == str(expected.value)


def test_plain_jpegs_take_torchvisions_decoder(tmp_path, monkeypatch):
    """On the project's build (torchvision 0.29's libjpeg-turbo) the probe passes, and a plain
    JPEG never reaches PIL's decoder; a PNG does."""
    assert datasets.turbo_matches_pil()
    jpeg, png = tmp_path / "x.jpg", tmp_path / "x.png"
    _photo(64, 48).save(jpeg, quality=90)
    _photo(64, 48).save(png)

    def refuse(path: str) -> Image.Image:
        raise AssertionError(f"PIL decoded {path}")

    monkeypatch.setattr(datasets, "load_image", refuse)
    assert load_rgb(str(jpeg)).shape == (48, 64, 3)
    with pytest.raises(AssertionError, match="PIL decoded"):
        load_rgb(str(png))


def test_a_decoder_that_differs_from_pil_is_not_used(tmp_path, monkeypatch, no_cached_probe):
    """The probe compares the two decoders on JPEGs of four encodings, once per process; one
    grey level off anywhere and every JPEG decodes with PIL."""
    real = torchvision.io.decode_jpeg

    def off_by_one(data: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        out = real(data, *args, **kwargs).clone()
        out[0, 0, 0] ^= 1
        return out

    monkeypatch.setattr(torchvision.io, "decode_jpeg", off_by_one)
    assert not datasets.turbo_matches_pil()
    path = tmp_path / "x.jpg"
    _photo(64, 48).save(path, quality=90)
    assert torch.equal(load_rgb(str(path)), torch.from_numpy(np.array(load_image(str(path)))))


def test_sources_load_rgb_is_load(tmp_path):
    """Both pretraining sources: ``load_rgb(i)`` is ``load(i)``'s pixels as a tensor."""
    root = tmp_path / "folder" / "c"
    root.mkdir(parents=True)
    _photo(50, 40).save(root / "a.jpg", quality=90)
    _photo(40, 50, seed=1).convert("P").save(root / "b.png")
    folder = ImageFolderSource(str(tmp_path / "folder"))
    fmnist = FashionMNISTSource(str(make_fashion_mnist(tmp_path / "fm", n_train=4, n_test=2)))
    resized = FashionMNISTSource(str(tmp_path / "fm"), image_size=32)
    for source in (folder, fmnist, resized):
        for i in range(len(source)):
            got = source.load_rgb(i)
            assert got.is_contiguous() and got.dtype == torch.uint8
            assert torch.equal(got, torch.from_numpy(np.array(source.load(i))))
    assert resized.load_rgb(0).shape == (32, 32, 3)


def _probe_jpegs(monkeypatch) -> list[bytes]:
    """The JPEGs a fresh probe hands torchvision's decoder (the probe's result left fresh)."""
    seen, real = [], torchvision.io.decode_jpeg

    def recording(data: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        seen.append(data.numpy().tobytes())
        return real(data, *args, **kwargs)

    monkeypatch.setattr(torchvision.io, "decode_jpeg", recording)
    datasets.turbo_matches_pil.cache_clear()
    try:
        assert datasets.turbo_matches_pil()
    finally:
        datasets.turbo_matches_pil.cache_clear()
    return seen


def test_probe_images_cover_odd_sizes_and_four_encodings(monkeypatch):
    """The probe decodes what the fast path will see: partial MCUs, 4:2:0/4:2:2/4:4:4,
    progressive and restart markers (a probe of easy cases would pass a wrong decoder)."""
    jpegs = _probe_jpegs(monkeypatch)
    assert len(jpegs) >= 4
    images = [Image.open(io.BytesIO(data)) for data in jpegs]
    assert all(img.size[0] % 16 and img.size[1] % 16 for img in images)  # partial MCUs
    # PIL's sampling codes: 0 is 4:4:4, 1 is 4:2:2, 2 is 4:2:0
    assert {JpegImagePlugin.get_sampling(img) for img in images} == {0, 1, 2}
    assert any(img.info.get("progressive") for img in images)
    assert any(b"\xff\xdd" in data for data in jpegs)  # a DRI segment: restart markers


def test_fast_path_reads_each_file_once(tmp_path, monkeypatch):
    """The header check and the decode share one read of the file."""
    path = tmp_path / "x.jpg"
    _photo(64, 48).save(path, quality=90)
    opened = []
    real_open = open

    def counting_open(file, *args, **kwargs):
        if str(file) == str(path):
            opened.append(file)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting_open)
    load_rgb(str(path))
    assert len(opened) == 1


def test_probe_result_is_cached(no_cached_probe, monkeypatch):
    """The probe decodes once per process: a second call decodes nothing."""
    calls = []
    real = torchvision.io.decode_jpeg
    monkeypatch.setattr(
        torchvision.io, "decode_jpeg", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    assert datasets.turbo_matches_pil()
    first = len(calls)
    assert first >= 4 and datasets.turbo_matches_pil()
    assert len(calls) == first
