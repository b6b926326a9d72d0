"""The pretraining command lines of README.md and docs/pretraining.md work as written on a
machine that has the data they name: they give the kNN monitor of the ImageNet-1K and
ImageNet-100 configs the labelled root beside ``DATASETS.ROOT /data/imagenet/train``, not the
configs' own ``datasets/imagenet`` (detectron2's ``datasets/`` convention), which would stop
every run where that folder does not exist.

Each such command is parsed as the tool parses it, with ``/data/imagenet`` moved to a small
generated ImageNet-like folder and the working directory moved where there is no ``datasets/``,
and its kNN monitor's images are opened (no training: these are 8-GPU ResNet-50 runs).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pretrain.data.datasets import read_class_list
from pretrain.engine.launch import argument_parser, load_args_config
from pretrain.evaluation.knn_monitor import knn_sources
from tests.helpers import ROOT, make_image_folder

README, PAGE = ROOT / "README.md", ROOT / "docs" / "pretraining.md"


def _commands(path: Path) -> list[list[str]]:
    """The argv of each command line of ``path`` that names DATASETS.ROOT /data/imagenet/train."""
    text = path.read_text().replace("\\\n", " ")
    lines = re.findall(r"^python tools/train_pretrain\.py .*$", text, flags=re.M)
    return [shlex.split(line)[2:] for line in lines if "DATASETS.ROOT /data/imagenet/train" in line]


def _configs(path: Path) -> list[str]:
    return [argv[argv.index("--config-file") + 1] for argv in _commands(path)]


def _imagenet(root, wnids: list[str]) -> None:
    """``root/{train,val}/<wnid>/``, one image each: ImageNet's layout."""
    make_image_folder(root / "train", classes=len(wnids), per_class=1, size=16)
    make_image_folder(root / "val", classes=len(wnids), per_class=1, size=16)
    for split in ("train", "val"):
        for i, wnid in enumerate(wnids):
            (root / split / f"class{i}").rename(root / split / wnid)


def test_the_pretraining_page_names_both_commands_and_the_readme_the_first():
    assert _configs(PAGE) == [
        "configs/pretrain/in1k_r50_lorac_200ep.yaml",
        "configs/pretrain/in100_r18_lorac_beta2.yaml",
    ]
    assert _configs(README) == ["configs/pretrain/in1k_r50_lorac_200ep.yaml"]


COMMANDS = [
    pytest.param(argv, id=f"{path.name}:{Path(argv[argv.index('--config-file') + 1]).stem}")
    for path in (README, PAGE)
    for argv in _commands(path)
]


@pytest.mark.parametrize("argv", COMMANDS)
def test_documented_command_finds_its_knn_images_next_to_the_training_data(
    tmp_path, argv, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # no datasets/imagenet here, as on most machines
    data = tmp_path / "imagenet"
    argv = [str(ROOT / a) if a.startswith("configs/") else a for a in argv]
    argv = [a.replace("/data/imagenet", str(data)) for a in argv]
    args = argument_parser("readme").parse_args(argv)
    cfg = load_args_config(args)
    assert cfg.TEST.KNN_PERIOD > 0 and str(data) == cfg.TEST.KNN_ROOT
    wnids = read_class_list(cfg.DATASETS.CLASS_LIST) if cfg.DATASETS.CLASS_LIST else []
    _imagenet(data, wnids or ["n01440764", "n01443537"])
    train, test = knn_sources(cfg)
    assert len(train) == len(test) == (len(wnids) or 2)
