"""What the docs say of the code holds: README's hidden files are skipped without being counted
(it said they were counted), docs/evaluation.md's number of checkpoint layouts is the reader's
(it said three of twelve), and the folders the docs' example commands write into are
git-ignored (``out/``, ``pretrained/`` and ``results/`` were not)."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess

import pytest

from pretrain.checkpoint.layouts import LAYOUTS
from pretrain.data.datasets import ImageFilesSource
from tests.helpers import ROOT, make_image_folder

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# where an example command writes: an output option's value, or the converter's output file
_WRITTEN = re.compile(
    r"(?:--output-dir|OUTPUT_DIR|--out|--table-dir|--cache-dir)[ =]+([\w.-]+/[^\s`)]*)"
    r"|tools/(?:convert_to_d2|export_backbone)\.py \S+ ([\w.-]+/[^\s`)]*)"
)


def test_hidden_files_are_skipped_uncounted_as_the_readme_says(tmp_path, caplog):
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "hidden files and folders are skipped without a count" in readme
    photos = make_image_folder(tmp_path / "photos", classes=1, per_class=2)
    shutil.copy(photos / "class0" / "img0.png", photos / ".thumbnail.png")
    (photos / ".cache").mkdir()
    shutil.copy(photos / "class0" / "img1.jpg", photos / ".cache" / "img1.jpg")
    (photos / ".DS_Store").write_bytes(b"\0")
    (photos / "notes.txt").write_text("a sidecar")
    with caplog.at_level(logging.INFO, logger="pretrain.data.datasets"):
        source = ImageFilesSource(str(photos))
    assert len(source) == 2
    assert "1 files without an image suffix left out (1 .txt)" in caplog.text


def test_the_number_of_checkpoint_layouts_the_docs_give_is_the_readers():
    said = [
        (path.name, n)
        for path in DOCS
        for n in re.findall(r"any of the (\w+) layouts", " ".join(path.read_text().split()))
    ]
    assert said, "no doc gives the number of layouts any more: drop this test"
    assert [(name, n) for name, n in said if n != str(len(LAYOUTS))] == []


def _written_folders() -> set[str]:
    """The top folders, relative to the working directory, that the docs' commands write in."""
    found = set()
    for path in DOCS:
        text = path.read_text().replace("\\\n", " ")
        for groups in _WRITTEN.findall(text):
            written = next(g for g in groups if g)
            if not written.startswith(("/", "~", "$")):
                found.add(written.split("/")[0])
    return found


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)
def test_the_folders_the_docs_examples_write_in_are_git_ignored():
    folders = _written_folders()
    assert {"out", "output", "pretrained", "results"} <= folders
    r = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", *(f"{f}/x" for f in folders)],
        capture_output=True,
        text=True,
    )
    ignored = {line.split("/")[0] for line in r.stdout.splitlines()}
    assert folders - ignored == set()
