"""Every checkpoint layout of docs/checkpoints.md: read back bit-exactly, and converted exactly.

For each layout a tiny synthetic file is written from a seeded torchvision ResNet-18 (random BN
statistics, so a mis-mapped BN shows) with that release's extra keys (heads, momentum encoders,
optimizer state). Reading it must give tensors ``torch.equal`` to the original backbone, and the
converter's detectron2 weights, loaded into detectron2's own ResNet, must reproduce torchvision's
res2..res5 features. Unknown and ambiguous files are refused with one line naming the file.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec
from detectron2.modeling.backbone import build_resnet_backbone

from tests.helpers import ROOT
from tests.helpers.checkpoints import CASES, bb, d2_names, pre, write
from transfer.checkpoint.layouts import LAYOUTS, layouts_table
from transfer.checkpoint.reader import CheckpointError, load_backbone
from transfer.checkpoint.resnet_names import d2_to_torchvision_name, torchvision_to_d2_name
from transfer.detection.convert import convert_checkpoint, convert_to_d2

REPO = ROOT


def _d2_resnet18() -> torch.nn.Module:
    cfg = get_cfg()
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.RESNETS.NORM = "BN"
    cfg.MODEL.RESNETS.STRIDE_IN_1X1 = False
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    return build_resnet_backbone(cfg, ShapeSpec(channels=3)).eval()


def _tv_features(model, x) -> list[torch.Tensor]:
    with torch.no_grad():
        x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        feats = []
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            x = layer(x)
            feats.append(x)
    return feats


def test_every_layout_has_a_case():
    """The table and the cases below cover each other (a new layout needs a test)."""
    covered = {layout for layout, _, _ in CASES.values()}
    assert covered | {"detectron2-caffe2"} == {layout.name for layout in LAYOUTS}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_reads_back_exactly_and_converts(case, net, other, tmp_path):
    layout, suffix, build = CASES[case]
    path = tmp_path / f"{case}{suffix}"
    write(path, build(net, other))
    weights = load_backbone(str(path))
    assert weights.layout == layout and weights.arch == "resnet18"
    expected = bb(net)
    assert sorted(weights.state_dict) == sorted(expected)
    for k, v in expected.items():
        assert torch.equal(weights.state_dict[k], v), k
    # the converter's detectron2 weights reproduce torchvision's features
    d2 = _d2_resnet18()
    d2.load_state_dict(convert_to_d2(weights), strict=True)
    x = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = d2(x)
    for i, e in enumerate(_tv_features(net, x)):
        g = got[f"res{i + 2}"]
        assert float((g - e).norm() / e.norm()) < 1e-5, f"{case}: res{i + 2}"


def test_dino_reads_the_teacher(net, other, tmp_path):
    """teacher and student differ: the teacher is read, the student listed as dropped."""
    path = tmp_path / "dino.pth"
    write(path, CASES["dino-ddp"][2](net, other))
    weights = load_backbone(str(path))
    assert torch.equal(
        weights.state_dict["layer4.1.bn2.running_var"], net.layer4[1].bn2.running_var
    )
    assert "module.head.mlp.0.weight" in weights.dropped


def test_dropped_keys_are_listed(net, other, tmp_path):
    path = tmp_path / "swav.pth"
    write(path, CASES["swav"][2](net, other))
    dropped = set(load_backbone(str(path)).dropped)
    assert {"module.projection_head.0.weight", "module.prototypes.weight"} <= dropped


def test_d2_pkl_round_trip_through_converter(net, tmp_path):
    """torchvision -> converter .pkl -> reader gives the original tensors (both directions)."""
    src, out = tmp_path / "tv.pth", tmp_path / "d2.pkl"
    torch.save(net.state_dict(), src)
    convert_checkpoint(str(src), str(out))
    back = load_backbone(str(out))
    assert back.layout == "detectron2" and back.filled == []
    assert all(torch.equal(back.state_dict[k], v) for k, v in bb(net).items())


def test_d2_frozen_bn_without_counters_is_filled(net, tmp_path):
    """detectron2's FrozenBatchNorm2d has no num_batches_tracked: filled with 0 and listed."""
    model = {k: v for k, v in d2_names(bb(net)).items() if "num_batches_tracked" not in k}
    path = tmp_path / "frozen.pkl"
    write(path, {"model": model, "__author__": "torchvision"})
    weights = load_backbone(str(path))
    assert "bn1.num_batches_tracked" in weights.filled
    assert int(weights.state_dict["layer1.0.bn1.num_batches_tracked"]) == 0


def test_trained_d2_model_names_map_back_and_only_a_converted_one_is_read(net, tmp_path):
    """Names from detectron2's own ResNet (not our mapping) inside a trained-model .pth map back;
    without an ``__author__`` that vouches for torchvision's stride placement the file is refused
    (a detector may put the stride in the 1x1 conv), for every tool that reads backbones."""
    d2 = _d2_resnet18()
    d2.load_state_dict(convert_to_d2(load_backbone_from(net, tmp_path)), strict=True)
    model = pre("backbone.bottom_up.", d2.state_dict())
    model |= {"backbone.fpn_lateral2.weight": torch.zeros(4, 64, 1, 1)}
    model |= {"roi_heads.box_predictor.cls_score.weight": torch.zeros(3, 8)}
    path = tmp_path / "model_final.pth"
    torch.save({"model": model, "iteration": 90000}, path)
    with pytest.raises(CheckpointError, match=r"__author__ None .*STRIDE_IN_1X1"):
        load_backbone(str(path))
    torch.save({"model": model, "iteration": 90000, "__author__": "torchvision"}, path)
    weights = load_backbone(str(path))
    assert weights.layout == "detectron2"
    assert all(torch.equal(weights.state_dict[k], v) for k, v in bb(net).items())
    assert "roi_heads.box_predictor.cls_score.weight" in weights.dropped


def load_backbone_from(model, tmp_path):
    path = tmp_path / "plain.pth"
    torch.save(model.state_dict(), path)
    return load_backbone(str(path))


@pytest.mark.parametrize("arch", ["resnet18", "resnet50"])
def test_name_mapping_is_one_mapping_two_directions(arch):
    tv = [k for k in getattr(torchvision.models, arch)().state_dict() if not k.startswith("fc.")]
    assert all(d2_to_torchvision_name(torchvision_to_d2_name(k)) == k for k in tv)
    cfg = get_cfg()
    cfg.MODEL.RESNETS.DEPTH = int(arch[len("resnet") :])
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64 if arch == "resnet18" else 256
    cfg.MODEL.RESNETS.NORM = "BN"
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    d2_keys = build_resnet_backbone(cfg, ShapeSpec(channels=3)).state_dict()
    assert sorted(d2_to_torchvision_name(k) for k in d2_keys) == sorted(tv)
    assert d2_to_torchvision_name("res2.0.conv4.weight") is None


# ---------------------------------------------------------------------------------------------
# refusals: one line naming the file


def test_unknown_layout_names_file_and_known_layouts(net, tmp_path):
    path = tmp_path / "mystery.pth"
    torch.save({"weights": pre("net.", bb(net))}, path)
    with pytest.raises(CheckpointError) as e:
        load_backbone(str(path))
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "no ResNet backbone in a known layout" in msg
    assert all(layout.name in msg for layout in LAYOUTS)


def test_ambiguous_layouts_are_refused(net, other, tmp_path):
    path = tmp_path / "both.pth"
    obj = {"teacher": pre("backbone.", bb(net))}
    obj["state_dict"] = pre("module.encoder_q.", bb(other))
    torch.save(obj, path)
    with pytest.raises(CheckpointError) as e:
        load_backbone(str(path))
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg and "ambiguous" in msg
    assert "moco" in msg and "dino" in msg


def test_two_layouts_with_the_same_weights_are_not_ambiguous(net, tmp_path):
    path = tmp_path / "same.pth"
    torch.save({"teacher": pre("backbone.", bb(net)), "state_dict": bb(net)}, path)
    assert load_backbone(str(path)).layout == "dino"  # the first in the table


def test_incomplete_backbone_names_layout_and_key(net, tmp_path):
    sd = pre("backbone.", bb(net))
    del sd["backbone.layer3.1.bn2.running_var"]
    path = tmp_path / "partial.ckpt"
    torch.save({"state_dict": sd}, path)
    with pytest.raises(CheckpointError, match=r"partial\.ckpt: solo-learn layout.*layer3\.1\.bn2"):
        load_backbone(str(path))


def test_caffe2_msra_is_refused_with_reason(tmp_path):
    path = tmp_path / "R-50.pkl"
    blobs = {"conv1_w": np.zeros((64, 3, 7, 7), np.float32)}
    blobs |= {"res2_0_branch2a_w": np.zeros((64, 64, 1, 1), np.float32)}
    write(path, {"blobs": blobs})
    with pytest.raises(CheckpointError, match=r"R-50\.pkl: detectron2-caffe2 layout.*1x1"):
        load_backbone(str(path))


class _Evil:
    def __reduce__(self):
        return (os.getpid, ())


def test_pickle_with_code_is_refused_without_running_it(tmp_path):
    path = tmp_path / "evil.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"x": _Evil()}}, f)
    with pytest.raises(CheckpointError, match=r"evil\.pkl: refusing to unpickle \w+\.getpid"):
        load_backbone(str(path))


class Config:  # stands in for a Lightning AttributeDict / omegaconf object in hyper_parameters
    def __init__(self):
        self.lr = 0.1


def test_weights_only_refusal_names_the_global(net, tmp_path):
    path = tmp_path / "lightning.ckpt"
    torch.save({"state_dict": pre("backbone.", bb(net)), "hyper_parameters": Config()}, path)
    with pytest.raises(CheckpointError, match=r"lightning\.ckpt: .*pickles .*Config.*weights-only"):
        load_backbone(str(path))


def test_docs_table_is_generated_from_the_layouts():
    text = (REPO / "docs" / "checkpoints.md").read_text()
    assert layouts_table() in text, "regenerate with: python -m transfer.checkpoint.layouts"
    assert "docs/checkpoints.md" in (REPO / "README.md").read_text()


@pytest.mark.parametrize("kind", ["unknown", "ambiguous"])
def test_converter_cli_refuses_in_one_line(kind, net, other, tmp_path):
    path = tmp_path / f"{kind}.pth"
    if kind == "unknown":
        torch.save({"weights": bb(net)}, path)
    else:
        torch.save({"resnet": bb(net), "state_dict": pre("backbone.", bb(other))}, path)
    result = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "convert_to_d2.py"),
            str(path),
            str(tmp_path / "o.pkl"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0]
    assert ("ambiguous" if kind == "ambiguous" else "known layout") in lines[0]


def test_analysis_names_the_layout_of_a_backbone_only_release(net, other, tmp_path):
    """The nuclear-norm analysis needs a LORAC run's full model: a release is refused, named."""
    from pretrain.config.defaults import get_cfg
    from transfer.analysis import AnalysisError
    from transfer.analysis.models import load_pretrained

    cfg = get_cfg()
    cfg.DATASETS.ROOT = str(tmp_path)
    (tmp_path / "config.yaml").write_text(cfg.dump())
    path = tmp_path / "swav_800ep.pth.tar"
    write(path, CASES["swav"][2](net, other))
    with pytest.raises(AnalysisError, match=r"swav_800ep\.pth\.tar: a swav-layout backbone.*knn"):
        load_pretrained(str(path))
