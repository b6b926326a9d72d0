"""The nuclear-norm analysis keeps each image's values by its index, so it leaves an unreadable
image out of its selection before any model runs, with a warning naming it and a count, and
reads image files only (others left out and counted)."""

from __future__ import annotations

import logging

from tests.helpers import make_image_folder
from transfer.analysis.nuclear_norm_stats import open_split


def test_open_split_leaves_out_unreadable_images_and_counts_them(tmp_path, caplog):
    root = tmp_path / "data"
    make_image_folder(root / "val", classes=2, per_class=2, size=16)
    (root / "val" / "class0" / "zero.png").write_bytes(b"")
    (root / "val" / "class1" / "Thumbs.db").write_bytes(b"\xd0\xcf")
    with caplog.at_level(logging.WARNING):
        source, indices = open_split("imagefolder", str(root), "test")
    assert len(source) == 5 and len(indices) == 4
    assert all(not source.describe(i).endswith("zero.png") for i in indices)
    assert any(m.startswith("skipped unreadable image: ") for m in caplog.messages)
    assert f"{root / 'val'} (test): 1 of 5 images skipped as unreadable" in caplog.messages
    assert f"{root / 'val'}: 1 files without an image suffix left out (1 .db)" in caplog.messages
