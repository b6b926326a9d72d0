"""Pretraining on a folder of unlabelled photos (``DATASETS.TYPE imagefiles``): images
at the top and in nested folders of any name, no class folders, a broken file skipped and
counted as in the other sources."""

from __future__ import annotations

import json
import re
import shlex
import shutil

from pretrain.config.defaults import load_config
from pretrain.data.datasets import build_source
from pretrain.engine.launch import argument_parser, load_args_config
from pretrain.engine.run import run_pretraining
from tests.helpers import ROOT, make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG


def test_a_flat_folder_with_nested_subfolders_pretrains(tmp_path):
    generated = make_image_folder(tmp_path / "generated", classes=2, per_class=7)
    photos = tmp_path / "photos"
    places = ["", "2019", "2019/summer holiday", "phone/DCIM/100APPLE"]
    for i, src in enumerate(sorted(generated.rglob("img*"))):
        dest = photos / places[i % len(places)] / f"IMG_{i:04d}{src.suffix.upper()}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    (photos / "2019" / "broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (photos / "phone" / "DCIM" / "100APPLE" / "IMG_0001.AAE").write_text("<plist/>")  # a sidecar
    (photos / "phone" / "zero.png").write_bytes(b"")
    out = tmp_path / "run"
    # 16 image files, 8 a batch: the 2 iterations are one epoch, every file drawn once
    opts = tiny_opts(photos, out, **{"DATASETS.TYPE": "imagefiles", "SOLVER.MAX_ITER": 2})
    trainer = run_pretraining(load_config(DEMO_CONFIG, opts))
    assert len(trainer.source) == 16 and trainer.max_iter == 2
    assert (out / "model_final.pth").is_file()
    metrics = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [0, 1]
    assert metrics[-1]["data/skipped_files"] == 2.0  # broken.jpg and zero.png, not the sidecar


def test_the_documented_photos_command_loads_and_finds_the_photos(tmp_path):
    """docs/pretraining.md's "Your own photos" command, parsed as the tool parses it, with
    ~/Pictures moved to a generated folder: a valid config whose source lists the photos."""
    text = (ROOT / "docs" / "pretraining.md").read_text().replace("\\\n", " ")
    [line] = [ln for ln in re.findall(r"^python tools/train_pretrain\.py .*$", text, flags=re.M)
              if "DATASETS.TYPE imagefiles" in ln]  # fmt: skip
    photos = make_image_folder(tmp_path / "Pictures", classes=2, per_class=2)
    argv = [str(ROOT / a) if a.startswith("configs/") else a for a in shlex.split(line)[2:]]
    argv = [str(photos) if a == "~/Pictures" else a for a in argv]
    cfg = load_args_config(argument_parser("readme").parse_args(argv))
    assert cfg.DATASETS.TYPE == "imagefiles" and len(build_source(cfg)) == 4
