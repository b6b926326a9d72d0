"""A zero-byte image and a ``Thumbs.db`` in an evaluation folder: ``knn_eval`` and
``linear_probe`` finish, the unreadable image skipped with a warning naming it and counted, the
non-image file left out and counted, never a ``BadImageError`` traceback."""

from __future__ import annotations

import os

import pytest

from tests.helpers.classification import IMAGENET_CLASSES, QUICK, make_imagenet
from tests.helpers.mistakes import run_main
from transfer.cli import knn_eval, linear_probe


@pytest.fixture(scope="module")
def imagenet(tmp_path_factory) -> str:
    root = make_imagenet(str(tmp_path_factory.mktemp("data") / "imagenet"))
    for split in ("train", "val"):
        folder = os.path.join(root, split, IMAGENET_CLASSES[0])
        open(os.path.join(folder, "zero.JPEG"), "wb").close()
        with open(os.path.join(folder, "Thumbs.db"), "wb") as f:
            f.write(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1")
    return root


def _assert_skipped_and_counted(output: str, root: str) -> None:
    assert "Traceback" not in output and "BadImageError" not in output
    zero = os.path.join(root, "val", IMAGENET_CLASSES[0], "zero.JPEG")
    assert f"skipped unreadable image: {zero}: zero-byte file" in output
    val = os.path.join(root, "val")
    assert f"{val}: 1 files without an image suffix left out (1 .db)" in output


def test_knn_eval_skips_a_zero_byte_image_and_leaves_out_thumbs_db(imagenet, tmp_path):
    argv = ["--random-init", "resnet18", "--dataset", "imagefolder", "--data-root", imagenet,
            "--num-workers", "0", "--image-size", "32", "--resize", "36", "--crop", "32",
            "--output-dir", str(tmp_path / "knn")]  # fmt: skip
    result = run_main(knn_eval.main, argv)
    assert result.returncode == 0, result.output
    _assert_skipped_and_counted(result.output, imagenet)
    assert "2 of 7 images skipped as unreadable" not in result.output  # one of each split
    assert "1 of 7 images skipped as unreadable" in result.output
    assert ",18/6," in (tmp_path / "knn" / "knn.csv").read_text()  # the images really used


def test_linear_probe_skips_a_zero_byte_image_and_leaves_out_thumbs_db(imagenet, tmp_path):
    argv = ["--config-file", f"{QUICK}/linear_instant.yaml", "--random-init", "resnet18",
            "--data-root", imagenet, "--device", "cpu",
            "--output-dir", str(tmp_path / "probe")]  # fmt: skip
    result = run_main(linear_probe.main, argv)
    assert result.returncode == 0, result.output
    _assert_skipped_and_counted(result.output, imagenet)


def test_the_transfer_harness_stops_in_one_line_when_an_indexed_image_is_unreadable():
    """Its splits are drawn by index: a feature set short of its index is a DatasetError naming
    the count and the fix, never the loader's label mismatch."""
    import torch

    from pretrain.utils.errors import DatasetError
    from transfer.classification.features import check_index_labels

    expected = torch.tensor([0, 0, 1, 1])
    with pytest.raises(DatasetError, match=r"dtd/train: 1 of 4 images are unreadable .* restore"):
        check_index_labels("dtd/train", torch.tensor([0, 1, 1]), expected)
    check_index_labels("dtd/train", expected.clone(), expected)
