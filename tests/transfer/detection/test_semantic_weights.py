"""One converted backbone file inside the semantic segmentation models: DeepLab's ResNet (directly
under ``backbone.``, res5 dilated with multi-grid) and Semantic FPN's (``backbone.bottom_up.``).

The check is numerical, as for the R-CNN configs (test_detection_convert.py): a torchvision
ResNet-50 with random weights and non-trivial BN statistics, converted once and loaded through the
trainer's checkpointer into the model each shipped config builds, computes torchvision's layer1-4
features. For DeepLab the reference is torchvision's own network with layer4 made as the config
dilates it (stride 1; 3x3 dilations 2, 4, 8 from RES5_DILATION 2 x RES5_MULTI_GRID 1, 2, 4): an
independent, plainly written statement of what the dilated res5 must compute.

``make test`` runs the Cityscapes DeepLab check (the backbone of both DeepLab configs) and the
name mapping; the other models and refusals build more R50s and are ``protocols`` tests.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
import torchvision
from detectron2.modeling import build_model
from torchvision.transforms import functional as TF

from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB
from tests.helpers import ROOT
from tests.helpers.checkpoints import randomise_bn
from transfer.detection.config import DetectionSetupError, load_config
from transfer.detection.convert import convert_checkpoint
from transfer.detection.layouts import model_layout, rename_for_model
from transfer.detection.weights import LayoutCheckpointer, check_weights_fit

DEEPLAB_CONFIGS = ["cityscapes_deeplab_lorac.yaml", "voc_deeplab_lorac.yaml"]
FPN_CONFIGS = ["cityscapes_semantic_fpn_lorac.yaml", "ade20k_semantic_fpn_lorac.yaml"]


@pytest.fixture(scope="module")
def resnet50() -> torchvision.models.ResNet:
    torch.manual_seed(0)
    return randomise_bn(torchvision.models.resnet50(), seed=1)


@pytest.fixture(scope="module")
def converted(resnet50, tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("r50")
    torch.save(resnet50.state_dict(), d / "r50.pth")
    convert_checkpoint(str(d / "r50.pth"), str(d / "r50.pkl"))
    return str(d / "r50.pkl")


@pytest.fixture(scope="module")
def image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(64, 96, 3), dtype=np.uint8)  # HWC RGB, multiple of 32


def _dilated_like_deeplab(model: torchvision.models.ResNet) -> torchvision.models.ResNet:
    """``model`` with layer4 at stride 1 and its blocks' 3x3 convs dilated 2, 4, 8."""
    model = copy.deepcopy(model)
    for block, d in zip(model.layer4, (2, 4, 8), strict=True):
        block.conv2.stride, block.conv2.dilation, block.conv2.padding = (1, 1), (d, d), (d, d)
    model.layer4[0].downsample[0].stride = (1, 1)
    return model


def _torchvision_features(model: torchvision.models.ResNet, image: np.ndarray) -> list:
    x = TF.normalize(TF.to_tensor(image), IMAGENET_MEAN_RGB, IMAGENET_STD_RGB)[None]
    with torch.no_grad():
        x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
        feats = []
        for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
            x = layer(x)
            feats.append(x)
    return feats


def _model(config: str, weights: str, *opts: str) -> torch.nn.Module:
    cfg = load_config(str(ROOT / "configs" / config), ["MODEL.DEVICE", "cpu", *opts])
    model = build_model(cfg).eval()
    check_weights_fit(model, weights)  # every backbone weight in the file, every name placed
    LayoutCheckpointer(model).load(weights)
    return model


def _resnet_features(model: torch.nn.Module, image: np.ndarray) -> list:
    """res2..res5 of the ResNet inside ``model`` (DeepLab outputs res2 and res5 only, so the
    stages are run one by one)."""
    resnet = getattr(model.backbone, "bottom_up", model.backbone)
    chw = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1))).float()
    with torch.no_grad():
        # SemanticSegmentor.forward's normalisation (detectron2 input: RGB, 0-255)
        x = resnet.stem(((chw - model.pixel_mean) / model.pixel_std)[None])
        feats = []
        for stage in resnet.stages:
            x = stage(x)
            feats.append(x)
    return feats


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).norm() / b.norm())


def _check_deeplab_features(config: str, resnet50, converted: str, image: np.ndarray) -> None:
    got = _resnet_features(_model(config, converted), image)
    plain = _torchvision_features(resnet50, image)
    expected = [*plain[:3], _torchvision_features(_dilated_like_deeplab(resnet50), image)[3]]
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert _rel_err(g, e) < 1e-4, f"res{i + 2}"
    # output stride 16: res5 keeps res4's size, so torchvision's strided layer4 is no reference
    assert got[3].shape[-2:] == got[2].shape[-2:] != plain[3].shape[-2:]


def test_converted_r50_computes_torchvision_features_in_deeplab(resnet50, converted, image):
    """The converted file fills DeepLab's ResNet exactly (loaded by the trainer's checkpointer
    under DeepLab's names, its layout in :mod:`transfer.detection.layouts`): res2-res4 are
    torchvision's layer1-3, res5 torchvision's layer4 dilated as the config says."""
    _check_deeplab_features(DEEPLAB_CONFIGS[0], resnet50, converted, image)


@pytest.mark.protocols
def test_converted_r50_computes_torchvision_features_in_voc_deeplab(resnet50, converted, image):
    _check_deeplab_features(DEEPLAB_CONFIGS[1], resnet50, converted, image)


@pytest.mark.protocols
def test_feature_comparison_detects_a_wrong_multi_grid(resnet50, converted, image):
    """Negative control: the dilated reference tells multi-grid (1, 2, 4) from (1, 1, 1)."""
    model = _model(DEEPLAB_CONFIGS[0], converted, "MODEL.RESNETS.RES5_MULTI_GRID", "[1, 1, 1]")
    got = _resnet_features(model, image)[3]
    expected = _torchvision_features(_dilated_like_deeplab(resnet50), image)[3]
    assert _rel_err(got, expected) > 1e-2


@pytest.mark.protocols
@pytest.mark.parametrize("config", FPN_CONFIGS)
def test_converted_r50_computes_torchvision_features_in_semantic_fpn(
    config, resnet50, converted, image
):
    model = _model(config, converted)
    got = _resnet_features(model, image)
    for i, (g, e) in enumerate(zip(got, _torchvision_features(resnet50, image), strict=True)):
        assert _rel_err(g, e) < 1e-4, f"res{i + 2}"


def test_deeplab_layout_takes_the_converted_resnet_directly_under_backbone():
    """DeepLab is one entry of the layout table: recognised from its keys (a whole ResNet
    under ``backbone.``, unlike C4's res5 in ``roi_heads``), a converted file renamed into it,
    a DeepLab run's own checkpoint (head names too) left as it is."""
    deeplab_keys = [
        *(f"backbone.{s}.0.conv1.weight" for s in ("res2", "res3", "res4", "res5")),
        "backbone.stem.conv1.weight",
        "sem_seg_head.predictor.weight",
    ]
    c4_keys = [k for k in deeplab_keys if ".res5." not in k] + ["roi_heads.res5.0.conv1.weight"]
    assert (model_layout(deeplab_keys), model_layout(c4_keys)) == ("deeplab", "c4")
    converted = {
        "backbone.bottom_up.stem.conv1.weight": 1,
        "backbone.bottom_up.res5.2.conv3.norm.running_var": 2,
    }
    assert rename_for_model(converted, deeplab_keys) == {
        "backbone.stem.conv1.weight": 1,
        "backbone.res5.2.conv3.norm.running_var": 2,
    }
    trained = {"backbone.res2.0.conv1.weight": 4, "sem_seg_head.predictor.weight": 3}
    assert rename_for_model(trained, deeplab_keys) == trained


@pytest.mark.protocols
def test_deeplab_stem_cannot_take_a_torchvision_resnet(converted):
    """detectron2's DeepLab stem (three 3x3 convs) has no counterpart in a torchvision ResNet:
    the weights check names the stem keys instead of training a random stem."""
    cfg = load_config(
        str(ROOT / "configs" / DEEPLAB_CONFIGS[0]),
        ["MODEL.DEVICE", "cpu", "MODEL.RESNETS.STEM_TYPE", "deeplab",
         "MODEL.RESNETS.STEM_OUT_CHANNELS", "128"],
    )  # fmt: skip
    model = build_model(cfg)
    with pytest.raises(DetectionSetupError) as e:
        check_weights_fit(model, converted)
    msg = str(e.value)
    assert "backbone.stem.conv1.weight (64, 3, 7, 7) vs model (64, 3, 3, 3)" in msg
    assert "missing backbone.stem.* (12 keys, e.g. backbone.stem.conv2." in msg


@pytest.mark.protocols
def test_a_file_without_res5_is_refused_naming_it(converted, tmp_path):
    """A converted file missing res5 stops before training, naming DeepLab's res5 keys."""
    with open(converted, "rb") as f:
        data = pickle.load(f)
    data["model"] = {k: v for k, v in data["model"].items() if ".res5." not in k}
    path = tmp_path / "no_res5.pkl"
    with open(path, "wb") as f:
        pickle.dump(data, f)
    cfg = load_config(str(ROOT / "configs" / DEEPLAB_CONFIGS[1]), ["MODEL.DEVICE", "cpu"])
    with pytest.raises(DetectionSetupError) as e:
        check_weights_fit(build_model(cfg), str(path))
    assert "the weights have no res5 (torchvision's layer4)" in str(e.value)
    assert "missing backbone.res5.* (60 keys, e.g. backbone.res5.0." in str(e.value)
