"""Bad input fails early with one clear message naming what is missing."""

from __future__ import annotations

import importlib
import os

import pytest
import torch
from torchvision.models import resnet18

from pretrain.data.datasets import DatasetError, FashionMNISTSource
from tests.helpers.classification import (  # noqa: F401
    QUICK,
    make_aircraft,
    make_dtd,
    make_imagenet,
    make_sun397,
    no_md5,
    single_thread,
)
from transfer.checkpoint.reader import CheckpointError
from transfer.classification.backbone import load_eval_backbone
from transfer.classification.config import (
    ConfigError,
    linear_probe_defaults,
    load_config,
    semi_supervised_defaults,
    transfer_defaults,
)
from transfer.classification.datasets import build_image_folder
from transfer.classification.semi import run_semi_supervised
from transfer.classification.transfer_datasets import DATASET_NAMES, build_transfer_dataset
from transfer.cli import transfer_linear


@pytest.mark.parametrize("key", list(DATASET_NAMES))
def test_missing_root_names_root_and_layout(key, tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(DatasetError) as e:
        build_transfer_dataset(key, missing)
    assert missing in str(e.value) and "expected" in str(e.value)
    assert not os.path.exists(missing)  # nothing was created


@pytest.mark.parametrize("key", list(DATASET_NAMES))
def test_wrong_layout_names_root_and_expected_layout(key, tmp_path, no_md5):  # noqa: F811
    """An existing but empty root: torchvision's message is wrapped with root and layout."""
    root = tmp_path / key
    (root / "unrelated").mkdir(parents=True)
    with pytest.raises(DatasetError) as e:
        build_transfer_dataset(key, str(root))
    assert str(root) in str(e.value) and "expected" in str(e.value)
    assert sorted(os.listdir(root)) == ["unrelated"]  # nothing was created (Caltech-101!)


def test_missing_split_files_are_named(tmp_path):
    make_sun397(str(tmp_path / "sun397"))
    os.remove(tmp_path / "sun397" / "Partitions" / "Testing_01.txt")
    with pytest.raises(DatasetError, match="Partitions/Testing_01.txt"):
        build_transfer_dataset("sun397", str(tmp_path / "sun397"))

    make_dtd(str(tmp_path / "dtd"))
    os.remove(tmp_path / "dtd" / "dtd" / "dtd" / "labels" / "val1.txt")
    with pytest.raises(DatasetError, match="val1.txt"):
        build_transfer_dataset("dtd", str(tmp_path / "dtd"))

    make_aircraft(str(tmp_path / "aircraft"))
    os.remove(tmp_path / "aircraft" / "fgvc-aircraft-2013b" / "data" / "images_variant_val.txt")
    with pytest.raises(DatasetError, match="images_variant_val.txt"):
        build_transfer_dataset("aircraft", str(tmp_path / "aircraft"))


def test_partition_listing_absent_images_is_named(tmp_path):
    make_sun397(str(tmp_path / "sun397"))
    with open(tmp_path / "sun397" / "Partitions" / "Training_01.txt", "a") as f:
        f.write("/z/zoo/sun_missing.jpg\n")
    with pytest.raises(DatasetError, match="sun_missing.jpg"):
        build_transfer_dataset("sun397", str(tmp_path / "sun397"))


def test_semi_supervised_split_file_problems(tmp_path):
    data = make_imagenet(str(tmp_path / "imagenet"))
    backbone = load_eval_backbone(random_init="resnet18")
    quick = os.path.join(QUICK, "semi_instant.yaml")
    out = ["OUTPUT_DIR", str(tmp_path / "o")]
    missing = str(tmp_path / "1percent.txt")
    cfg = load_config(semi_supervised_defaults(), quick, [*out, "DATA.SPLIT_FILE", missing])
    with pytest.raises(DatasetError, match="1percent.txt: no such label-split file"):
        run_semi_supervised(cfg, backbone, data, "cpu")
    with open(missing, "w") as f:
        f.write("n01440764_0.JPEG\nn09999999_7.JPEG\n")
    with pytest.raises(DatasetError, match=r"1 of 2 listed images .*n09999999_7.JPEG"):
        run_semi_supervised(cfg, backbone, data, "cpu")
    cfg = load_config(semi_supervised_defaults(), quick, out)
    with pytest.raises(DatasetError, match="SPLIT_FILE is empty"):
        run_semi_supervised(cfg, backbone, data, "cpu")


def test_image_folder_and_class_list_problems(tmp_path):
    with pytest.raises(DatasetError, match="image folder does not exist"):
        build_image_folder(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="not an image folder"):
        build_image_folder(str(tmp_path / "empty"))
    data = make_imagenet(str(tmp_path / "imagenet"))
    (tmp_path / "in100.txt").write_text("n01440764\nn04999999\n")
    with pytest.raises(DatasetError, match=r"1 classes of the class list have no folder.*n04999"):
        build_image_folder(os.path.join(data, "train"), str(tmp_path / "in100.txt"))
    with pytest.raises(DatasetError, match="no such class-list file"):
        build_image_folder(os.path.join(data, "train"), str(tmp_path / "missing.txt"))


def test_fashion_mnist_missing_files(tmp_path):
    with pytest.raises(DatasetError, match="not a directory"):
        FashionMNISTSource(str(tmp_path / "nope"))
    with pytest.raises(DatasetError, match="missing Fashion-MNIST file train-images-idx3-ubyte"):
        FashionMNISTSource(str(tmp_path))


def test_checkpoint_without_backbone_is_named(tmp_path):
    bad = str(tmp_path / "head_only.pth")
    torch.save({"state_dict": {"module.fc.weight": torch.zeros(2, 2)}}, bad)
    with pytest.raises(CheckpointError, match="head_only.pth: no ResNet backbone"):
        load_eval_backbone(checkpoint=bad)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_eval_backbone(checkpoint=str(tmp_path / "missing.pth"))
    with pytest.raises(ValueError, match="exactly one"):
        load_eval_backbone()


@pytest.mark.parametrize("kind", ["no_backbone", "ambiguous"])
@pytest.mark.parametrize("tool_name", ["linear_probe", "transfer_linear", "knn_eval"])
def test_tools_report_bad_checkpoint_in_one_line(tool_name, kind, tmp_path, capsys):
    """Proves each tool exits with status 2 and an ``error:`` line naming the file (no
    traceback, no training on random weights), for a file in no known layout and for one in
    two layouts with different weights."""
    bad = str(tmp_path / "not_a_backbone.pth")
    if kind == "no_backbone":
        torch.save({"model": {"encoder_q.head.0.weight": torch.zeros(2, 2)}}, bad)
        expected = "not_a_backbone.pth: no ResNet backbone in a known layout (known: lorac, moco"
    else:
        sd = {k: v for k, v in resnet18().state_dict().items() if not k.startswith("fc.")}
        torch.save({"teacher": {f"backbone.{k}": v for k, v in sd.items()}, "resnet": {
            k: v + 1 if v.is_floating_point() else v for k, v in sd.items()
        }}, bad)  # fmt: skip
        expected = "not_a_backbone.pth: ambiguous checkpoint: layouts dino"
    data = make_imagenet(str(tmp_path / "imagenet"))
    tool = importlib.import_module(f"transfer.cli.{tool_name}")
    argv = ["--checkpoint", bad, "--output-dir", str(tmp_path / "o"), "--data-root", data]
    if tool_name == "knn_eval":
        argv += ["--dataset", "imagefolder"]
    if tool_name == "transfer_linear":
        argv += ["--datasets", "dtd"]
        make_dtd(str(tmp_path / "imagenet" / "dtd"))
    with pytest.raises(SystemExit) as e:
        tool.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last
    assert "checkpoint_io.py" not in err  # no traceback through the reader


def test_transfer_tool_missing_dataset_root(tmp_path, capsys):
    argv = [
        "--random-init",
        "resnet18",
        "--output-dir",
        str(tmp_path / "o"),
        "--data-root",
        str(tmp_path / "data"),
        "--datasets",
        "cifar10,pets",
    ]
    with pytest.raises(SystemExit):
        transfer_linear.main(argv)
    err = capsys.readouterr().err
    assert "cifar10: dataset root" in err and os.path.join(str(tmp_path), "data", "cifar10") in err


def test_config_errors_name_file_and_key(tmp_path):
    bad = tmp_path / "typo.yaml"
    bad.write_text("SOLVER:\n  BASE_RL: 0.1\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: .*SOLVER.BASE_RL"):
        load_config(linear_probe_defaults(), str(bad))
    bad.write_text("SOLVER:\n  SCHEDULE: linear\n")
    with pytest.raises(ConfigError, match=r"typo.yaml: SOLVER.SCHEDULE = 'linear'"):
        load_config(linear_probe_defaults(), str(bad))
    bad.write_text("TRANSFER:\n  BUDGET:\n    DTD: {ITERS: 10, EPOCHS: 10}\n")
    with pytest.raises(ConfigError, match="TRANSFER.BUDGET.DTD"):
        load_config(transfer_defaults(), str(bad))
    with pytest.raises(ConfigError, match="TRANSFER.DATASETS"):
        load_config(transfer_defaults(), "", ["TRANSFER.DATASETS", "['imagenet']"])
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(transfer_defaults(), str(tmp_path / "missing.yaml"))
    bad.write_text("TRANSFER:\n  PROTOCOL: augmneted\n")
    msg = r"typo.yaml: TRANSFER.PROTOCOL = 'augmneted'.*"
    msg += r"\['cached_features', 'augmented', 'finetune'\]"
    with pytest.raises(ConfigError, match=msg):
        load_config(transfer_defaults(), str(bad))
