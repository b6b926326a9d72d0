"""Backbone conversion to detectron2: names, numerics through the real configs, and the CLI.

The central check: a torchvision ResNet-50 with random weights and non-trivial BN statistics,
converted and loaded into the model built from each LORAC config, computes the same res2..res5
features as torchvision's layer1..layer4 when each side preprocesses the image its own way
(detectron2: 0-255 RGB normalised by MODEL.PIXEL_MEAN/STD; torchvision: ToTensor + Normalize).
That pins the key mapping, STRIDE_IN_1X1, INPUT.FORMAT and the pixel statistics at once; the
negative controls show the comparison notices a wrong stride or BGR statistics.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from detectron2.config import get_cfg
from detectron2.layers import ShapeSpec
from detectron2.modeling import build_model
from detectron2.modeling.backbone import build_resnet_backbone
from torchvision.transforms import functional as TF

from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
from tests.helpers import ROOT
from tests.helpers.checkpoints import randomise_bn
from transfer.checkpoint.reader import BackboneWeights
from transfer.detection.config import DetectionSetupError, load_config
from transfer.detection.convert import (
    FPN_PREFIX,
    ConversionError,
    convert_checkpoint,
    convert_to_d2,
)
from transfer.detection.weights import LayoutCheckpointer, check_weights_fit

REPO = ROOT
LORAC_CONFIGS = [
    "coco_faster_rcnn_lorac.yaml",
    "coco_mask_rcnn_lorac.yaml",
    "coco_keypoint_rcnn_lorac.yaml",
]
# C4 models: stem..res4 in the backbone, res5 in the ROI head (Res5ROIHeadsExtraNorm)
C4_CONFIGS = ["voc_faster_rcnn_c4_lorac.yaml", "coco_mask_rcnn_c4_lorac.yaml"]


def _torchvision_features(model: torchvision.models.ResNet, image: np.ndarray) -> list:
    x = TF.normalize(TF.to_tensor(image), IMAGENET_MEAN_RGB, IMAGENET_STD_RGB)[None]
    with torch.no_grad():
        x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        feats = []
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            x = layer(x)
            feats.append(x)
    return feats


def _d2_features(config: str, weights_file: str, image: np.ndarray, *opts: str) -> list:
    """res2..res5 of the model built from ``config`` with ``weights_file`` loaded as the
    trainer loads it (checked, then renamed to the model's layout)."""
    cfg = load_config(str(REPO / "configs" / config), ["MODEL.DEVICE", "cpu", *opts])
    model = build_model(cfg).eval()
    check_weights_fit(model, weights_file)
    LayoutCheckpointer(model).load(weights_file)
    # detectron2's input: HWC uint8 in INPUT.FORMAT (RGB) -> CHW float, 0-255.
    chw = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1))).float()
    with torch.no_grad():
        images = model.preprocess_image([{"image": chw}])
        assert images.tensor.shape[-2:] == chw.shape[-2:], "image must not need padding"
        if hasattr(model.backbone, "bottom_up"):  # FPN
            out = model.backbone.bottom_up(images.tensor)
            return [out[f"res{i}"] for i in range(2, 6)]
        # C4: the backbone's stages, then the ROI head's res5 blocks (less its extra norm)
        x, feats = model.backbone.stem(images.tensor), []
        for name in ("res2", "res3", "res4"):
            x = getattr(model.backbone, name)(x)
            feats.append(x)
        res5 = model.roi_heads.res5
        assert isinstance(res5[-1], torch.nn.SyncBatchNorm)  # MoCo's extra BN after res5
        return [*feats, res5[:-1](x)]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(96, 128, 3), dtype=np.uint8)  # HWC RGB, multiple of 32


@pytest.fixture(scope="module")
def resnet50() -> torchvision.models.ResNet:
    torch.manual_seed(0)
    return randomise_bn(torchvision.models.resnet50(), seed=1)


@pytest.fixture(scope="module")
def r50_files(resnet50, tmp_path_factory) -> dict[str, Path]:
    """The same weights saved in the three layouts the converter reads."""
    d = tmp_path_factory.mktemp("r50")
    sd = resnet50.state_dict()
    backbone = {k: v for k, v in sd.items() if not k.startswith("fc.")}
    paths = {name: d / f"{name}.pth" for name in ("torchvision", "moco", "lorac")}
    torch.save(sd, paths["torchvision"])
    moco = {f"module.encoder_q.{k}": v for k, v in backbone.items()}
    moco |= {"module.encoder_q.fc.0.weight": torch.randn(2048, 2048)}
    moco |= {"module.encoder_q.fc.2.weight": torch.randn(128, 2048)}
    moco |= {f"module.encoder_k.{k}": torch.zeros_like(v) for k, v in backbone.items()}
    moco |= {"module.queue": torch.randn(128, 64), "module.queue_ptr": torch.zeros(1)}
    torch.save({"state_dict": moco, "epoch": 200, "arch": "resnet50"}, paths["moco"])
    lorac = {f"encoder_q.backbone.{k}": v for k, v in backbone.items()}
    lorac |= {"encoder_q.head.0.weight": torch.randn(2048, 2048)}
    lorac |= {f"encoder_k.backbone.{k}": torch.zeros_like(v) for k, v in backbone.items()}
    lorac |= {"queues": torch.randn(2, 128, 64), "queue_ptr": torch.zeros(2)}
    torch.save({"model": lorac, "iteration": 10}, paths["lorac"])
    return paths


@pytest.fixture(scope="module")
def r50_d2(r50_files, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("d2") / "tv_r50.pkl"
    convert_checkpoint(str(r50_files["torchvision"]), str(out))
    return str(out)


@pytest.mark.parametrize("config", LORAC_CONFIGS)
def test_converted_r50_matches_torchvision_features(config, resnet50, r50_d2, image):
    """Each LORAC config's backbone reproduces torchvision's features from converted weights."""
    expected = _torchvision_features(resnet50, image)
    got = _d2_features(config, r50_d2, image)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert _rel_err(g, e) < 1e-4, f"res{i + 2} differs from layer{i + 1}"


@pytest.mark.parametrize("config", C4_CONFIGS)
def test_one_converted_file_gives_torchvision_features_in_c4_models(
    config, resnet50, r50_d2, image
):
    """The same converted file (written with the FPN prefix) fills a C4 model: stem..res4 in
    its backbone and res5 in ``roi_heads.res5``, each stage computing torchvision's layer."""
    expected = _torchvision_features(resnet50, image)
    got = _d2_features(config, r50_d2, image)
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert _rel_err(g, e) < 1e-4, f"res{i + 2} differs from layer{i + 1}"


def test_a_file_without_res5_is_refused_by_a_c4_model_naming_roi_heads_res5(r50_d2, tmp_path):
    """A backbone file lacking layer4 (res5) would leave the C4 head's res5 random: the check
    names the missing ``roi_heads.res5`` keys, while an FPN model names its own."""
    with open(r50_d2, "rb") as f:
        data = pickle.load(f)
    data["model"] = {k: v for k, v in data["model"].items() if ".res5." not in k}
    no_res5 = tmp_path / "no_res5.pkl"
    with open(no_res5, "wb") as f:
        pickle.dump(data, f)
    for config, named in (
        ("voc_faster_rcnn_c4_lorac.yaml", "missing roi_heads.res5.* (60 keys, e.g."),
        ("coco_faster_rcnn_lorac.yaml", "missing backbone.bottom_up.res5.* (60 keys, e.g."),
    ):
        cfg = load_config(str(REPO / "configs" / config), ["MODEL.DEVICE", "cpu"])
        with pytest.raises(DetectionSetupError) as e:
            check_weights_fit(build_model(cfg), str(no_res5))
        assert named in str(e.value) and str(no_res5) in str(e.value)
        assert "the weights have no res5 (torchvision's layer4)" in str(e.value)


@pytest.mark.parametrize(("layout", "suffix"), [("moco", ".pth"), ("lorac", ".pkl")])
def test_public_and_project_layouts_convert_to_the_same_features(
    layout, suffix, resnet50, r50_files, image, tmp_path
):
    """MoCo-release and project-pretraining checkpoints give torchvision's features too."""
    out = tmp_path / f"{layout}{suffix}"
    report = convert_checkpoint(str(r50_files[layout]), str(out))
    assert report.source_format == layout and report.arch == "resnet50"
    assert report.num_converted == len(
        [k for k in resnet50.state_dict() if not k.startswith("fc.")]
    )
    dropped = set(report.dropped)
    if layout == "moco":
        assert {"module.encoder_q.fc.0.weight", "module.queue", "module.queue_ptr"} <= dropped
        assert "module.encoder_k.conv1.weight" in dropped
    else:
        assert {"encoder_q.head.0.weight", "queues", "queue_ptr"} <= dropped
        assert "encoder_k.backbone.conv1.weight" in dropped
    expected = _torchvision_features(resnet50, image)
    got = _d2_features("coco_mask_rcnn_lorac.yaml", str(out), image)
    for g, e in zip(got, expected, strict=True):
        assert _rel_err(g, e) < 1e-4


@pytest.mark.parametrize(
    "opts",
    [
        ("MODEL.RESNETS.STRIDE_IN_1X1", "True"),  # detectron2's Caffe2-style default
        ("MODEL.PIXEL_MEAN", "[103.53, 116.28, 123.675]"),  # BGR statistics on RGB input
    ],
)
def test_feature_comparison_detects_wrong_settings(opts, resnet50, r50_d2, image):
    """Negative control: the comparison above fails for a wrong stride or wrong statistics."""
    expected = _torchvision_features(resnet50, image)
    got = _d2_features("coco_mask_rcnn_lorac.yaml", r50_d2, image, *opts)
    assert _rel_err(got[-1], expected[-1]) > 1e-2


def test_converted_file_format(r50_d2):
    with open(r50_d2, "rb") as f:
        data = pickle.load(f)
    assert data["__author__"] == "lorac" and data["matching_heuristics"] is False
    assert all(k.startswith(FPN_PREFIX) for k in data["model"])
    assert all(isinstance(v, np.ndarray) for v in data["model"].values())
    assert data["model"][FPN_PREFIX + "res5.2.conv3.norm.running_var"].shape == (2048,)


def _d2_resnet(depth: int) -> torch.nn.Module:
    cfg = get_cfg()
    cfg.MODEL.RESNETS.DEPTH = depth
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64 if depth < 50 else 256
    cfg.MODEL.RESNETS.NORM = "BN"
    cfg.MODEL.RESNETS.STRIDE_IN_1X1 = False
    cfg.MODEL.RESNETS.OUT_FEATURES = ["res2", "res3", "res4", "res5"]
    cfg.MODEL.BACKBONE.FREEZE_AT = 0
    return build_resnet_backbone(cfg, ShapeSpec(channels=3)).eval()


@pytest.mark.parametrize("arch", ["resnet18", "resnet34"])
def test_basic_block_resnet_maps_every_key(arch, image):
    """R18/R34: the converted names and shapes are exactly detectron2's basic-block ResNet."""
    torch.manual_seed(0)
    tv = randomise_bn(getattr(torchvision.models, arch)(), seed=2)
    weights = BackboneWeights(
        {k: v for k, v in tv.state_dict().items() if not k.startswith("fc.")}, arch, "torchvision"
    )
    converted = convert_to_d2(weights)
    d2 = _d2_resnet(int(arch[len("resnet") :]))
    reference = d2.state_dict()
    assert sorted(converted) == sorted(reference)
    assert all(converted[k].shape == reference[k].shape for k in reference)
    d2.load_state_dict(converted, strict=True)
    x = TF.normalize(TF.to_tensor(image), IMAGENET_MEAN_RGB, IMAGENET_STD_RGB)[None]
    with torch.no_grad():
        got = d2(x)
    for i, e in enumerate(_torchvision_features(tv, image)):
        assert _rel_err(got[f"res{i + 2}"], e) < 1e-4


def test_conversion_fails_loudly_naming_keys():
    sd = {k: v for k, v in torchvision.models.resnet18().state_dict().items() if "fc." not in k}
    missing = dict(sd)
    del missing["layer3.1.bn2.running_var"]
    with pytest.raises(ConversionError, match=r"layer3\.1\.bn2\.running_var"):
        convert_to_d2(BackboneWeights(missing, "resnet18", "torchvision"))
    extra = dict(sd) | {"layer2.0.attention.weight": torch.zeros(1)}
    with pytest.raises(ConversionError, match=r"layer2\.0\.attention\.weight"):
        convert_to_d2(BackboneWeights(extra, "resnet18", "torchvision"))


def test_bad_output_suffix_is_refused(r50_files, tmp_path):
    with pytest.raises(ConversionError, match=r"\.pkl or \.pth"):
        convert_checkpoint(str(r50_files["torchvision"]), str(tmp_path / "out.npz"))


# ---------------------------------------------------------------------------------------------
# tools/convert_to_d2.py


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "tools" / "convert_to_d2.py"), *map(str, args)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_cli_reports_dropped_keys_and_output(tmp_path):
    tv = torchvision.models.resnet18()
    sd = {f"encoder_q.backbone.{k}": v for k, v in tv.state_dict().items() if "fc." not in k}
    sd |= {"encoder_q.head.0.weight": torch.zeros(4, 4), "queues": torch.zeros(2, 4, 8)}
    sd |= {"encoder_k.backbone.conv1.weight": torch.zeros(1)}
    ckpt, out = tmp_path / "ckpt.pth", tmp_path / "out" / "r18.pkl"
    torch.save({"model": sd}, ckpt)
    result = _cli(ckpt, out)
    assert result.returncode == 0, result.stderr
    for key in ("encoder_q.head.0.weight", "queues", "encoder_k.backbone.conv1.weight"):
        assert key in result.stdout
    assert "resnet18" in result.stdout and str(out) in result.stdout
    with open(out, "rb") as f:
        assert len(pickle.load(f)["model"]) == len(sd) - 3


@pytest.mark.parametrize("kind", ["garbage", "text", "missing", "no_backbone"])
def test_cli_bad_input_exits_2_with_one_line(kind, tmp_path):
    path = tmp_path / f"{kind}.pth"
    if kind == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(4096))
    elif kind == "text":
        path.write_text("this is not a checkpoint\n" * 10)
    elif kind == "no_backbone":
        torch.save({"state_dict": {"weight": torch.zeros(3)}}, path)
    result = _cli(path, tmp_path / "out.pkl")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert str(path) in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "out.pkl").exists()
