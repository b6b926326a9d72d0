"""ResNet-18/34 backbones for detection from the one key the weights error names: R18 weights
into the shipped R50-FPN configs are refused with an error that says which depth the weights
have; ``MODEL.RESNETS.DEPTH 18`` alone builds the basic-block ResNet that converted R18/R34
weights fit (and trains it), without detectron2's ``AssertionError: Must set
MODEL.RESNETS.RES2_OUT_CHANNELS = 64``; and what basic blocks cannot have is one
``ConfigError`` naming every key."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torchvision
from detectron2.modeling import build_model

from pretrain.utils.errors import ConfigError
from tests.helpers import ROOT
from tests.transfer.detection.test_detection_train import instant_args, make_coco
from transfer.detection.config import DetectionSetupError, load_config
from transfer.detection.convert import convert_checkpoint
from transfer.detection.trainer import run
from transfer.detection.weights import check_weights_fit

FPN = str(ROOT / "configs" / "coco_faster_rcnn_lorac.yaml")


@pytest.fixture(scope="module")
def r18(tmp_path_factory) -> str:
    """Converted random-weight torchvision ResNet-18."""
    d = tmp_path_factory.mktemp("weights")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18().state_dict(), d / "resnet18.pth")
    convert_checkpoint(str(d / "resnet18.pth"), str(d / "resnet18.pkl"))
    return str(d / "resnet18.pkl")


@pytest.mark.parametrize("depth", [18, 34])
def test_the_depth_alone_builds_a_basic_block_resnet(depth):
    cfg = load_config(FPN, ["MODEL.DEVICE", "cpu", "MODEL.RESNETS.DEPTH", str(depth)])
    assert cfg.MODEL.RESNETS.RES2_OUT_CHANNELS == 64  # derived from the depth
    names = build_model(cfg).state_dict()
    assert "backbone.bottom_up.res2.0.conv2.weight" in names
    assert "backbone.bottom_up.res2.0.conv3.weight" not in names  # basic blocks
    blocks = {n.split(".")[3] for n in names if n.startswith("backbone.bottom_up.res5.")}
    assert len(blocks) == (2 if depth == 18 else 3)


def test_the_weights_error_names_their_depth_and_following_it_fits(r18):
    """The R50 model refuses R18 weights naming the key to set; with it the weights fit."""
    r50 = build_model(load_config(FPN, ["MODEL.DEVICE", "cpu"]))
    with pytest.raises(DetectionSetupError) as e:
        check_weights_fit(r50, r18)
    assert "the weights are a ResNet-18, the model a ResNet-50: add MODEL.RESNETS.DEPTH 18" in str(
        e.value
    )
    cfg = load_config(FPN, ["MODEL.DEVICE", "cpu", "MODEL.RESNETS.DEPTH", "18"])
    check_weights_fit(build_model(cfg), r18)


@pytest.mark.parametrize(
    "opts,named",
    [
        (["MODEL.RESNETS.RES2_OUT_CHANNELS", "128"], ["RES2_OUT_CHANNELS 128 (must be 64)"]),
        (
            ["MODEL.RESNETS.RES5_DILATION", "2", "MODEL.RESNETS.NUM_GROUPS", "32"],
            ["RES5_DILATION 2 (must be 1)", "NUM_GROUPS 32 (must be 1)"],
        ),
        (["MODEL.RESNETS.DEFORM_ON_PER_STAGE", "[False, False, True, True]"], ["DEFORM_ON"]),
        (["MODEL.ROI_HEADS.NAME", "Res5ROIHeads"], ["Res5ROIHeads (a C4 config"]),
    ],
)
def test_what_basic_blocks_cannot_have_is_one_error_naming_every_key(opts, named):
    with pytest.raises(ConfigError) as e:
        load_config(FPN, ["MODEL.RESNETS.DEPTH", "34", *opts])
    assert str(e.value).startswith(f"{FPN}: MODEL.RESNETS.DEPTH 34 (a ResNet of basic blocks)")
    for text in named:
        assert text in str(e.value)


def test_r18_weights_train_and_evaluate(r18, tmp_path):
    """A few iterations of Faster R-CNN R18-FPN from converted R18 weights, then COCO AP."""
    data = {"shapes": make_coco(tmp_path / "coco")}
    out = tmp_path / "run"
    opts = ["MODEL.RESNETS.DEPTH", "18", "TEST.PRECISE_BN.ENABLED", "False"]
    args = instant_args("faster_rcnn", data, r18, out, *opts)
    try:
        results = run(args)
    finally:  # the name is test_detection_train's too, over its own files
        from detectron2.data import DatasetCatalog, MetadataCatalog

        if "instant_shapes" in DatasetCatalog.list():
            DatasetCatalog.remove("instant_shapes")
            MetadataCatalog.remove("instant_shapes")
    assert math.isfinite(results["instant_shapes"]["bbox"]["AP"])
    assert Path(out / "model_final.pth").is_file()


def test_the_console_printer_prints_each_iteration_once(tmp_path, caplog):
    """detectron2's writers, with pretraining's MetricPrinter first: a stop soon after a resume
    (no "time" history yet) made ``after_train``'s second write of one iteration divide by zero
    in detectron2's own printer (tests/pretrain/engine/test_hooks.py shows it)."""
    from types import SimpleNamespace

    from detectron2.config import CfgNode
    from detectron2.engine import default_writers
    from detectron2.utils.events import EventStorage

    from pretrain.engine.hooks import MetricPrinter
    from transfer.detection.trainer import DetectionTrainer

    trainer = SimpleNamespace(cfg=CfgNode({"OUTPUT_DIR": str(tmp_path)}), max_iter=10)
    writers = DetectionTrainer.build_writers(trainer)
    assert type(writers[0]) is MetricPrinter
    with EventStorage(4) as storage, caplog.at_level("INFO"):
        storage.put_scalar("time", 60.0)
        writers[0].write()
    # the ETA of the 5 iterations left (max_iter 10) at 60 s each
    assert any("eta: 0:05:00" in r.getMessage() for r in caplog.records), caplog.text
    defaults = default_writers(str(tmp_path), 10)
    assert [type(w) for w in writers[1:]] == [type(w) for w in defaults[1:]]
