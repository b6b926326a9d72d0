"""The README's pretraining command lines work as written on a machine that has the data they
name (issue 34, finding 7): they give the kNN monitor of the ImageNet-1K and ImageNet-100
configs the labelled root beside ``DATASETS.ROOT /data/imagenet/train`` (the configs' own
``datasets/imagenet``, detectron2's ``datasets/`` convention, stopped every run where that
folder did not exist).

Each README command is parsed as the tool parses it, with ``/data/imagenet`` moved to a small
generated ImageNet-like folder and the working directory moved where there is no ``datasets/``,
and its kNN monitor's images are opened (no training: these are 8-GPU ResNet-50 runs).
"""

from __future__ import annotations

import re
import shlex

import pytest

from pretrain.data.datasets import read_class_list
from pretrain.engine.launch import argument_parser, load_args_config
from pretrain.evaluation.knn_monitor import knn_sources
from tests.helpers import ROOT, make_image_folder


def _readme_commands() -> list[list[str]]:
    """The argv of each README command line that names DATASETS.ROOT /data/imagenet/train."""
    text = (ROOT / "README.md").read_text().replace("\\\n", " ")
    lines = re.findall(r"^python tools/train_pretrain\.py .*$", text, flags=re.M)
    return [shlex.split(line)[2:] for line in lines if "DATASETS.ROOT /data/imagenet/train" in line]


def _imagenet(root, wnids: list[str]) -> None:
    """``root/{train,val}/<wnid>/``, one image each: ImageNet's layout."""
    make_image_folder(root / "train", classes=len(wnids), per_class=1, size=16)
    make_image_folder(root / "val", classes=len(wnids), per_class=1, size=16)
    for split in ("train", "val"):
        for i, wnid in enumerate(wnids):
            (root / split / f"class{i}").rename(root / split / wnid)


def test_the_readme_names_both_commands():
    configs = [argv[argv.index("--config-file") + 1] for argv in _readme_commands()]
    assert configs == [
        "configs/pretrain/in1k_r50_lorac_200ep.yaml",
        "configs/pretrain/in100_r18_lorac_beta2.yaml",
    ]


@pytest.mark.parametrize("argv", _readme_commands(), ids=lambda a: a[a.index("--config-file") + 1])
def test_readme_command_finds_its_knn_images_next_to_the_training_data(tmp_path, argv, monkeypatch):
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
