"""tools/export_backbone.py and hubconf.py: our checkpoints and public layouts as torchvision and
timm ResNets that compute what the checkpoint's own backbone computes.

The public layouts are the fakes of tests/helpers/checkpoints.py (a seeded ResNet-18 with
random BN statistics, saved with each release's extra keys); this project's own checkpoint is a
real pretraining model (the demo config) saved by the trainer's checkpointer. For each, the
exported file loaded ``strict=True`` into torchvision's and timm's ResNet must give the pooled
features of the backbone it came from (to 1e-5), so a dropped, swapped or mis-mapped tensor
shows. Bad inputs end the tool with exit status 2, one line naming the file and no output.

The command line runs the tool's ``main`` in this process (:func:`run_main`), where a process
adds nothing; one bad input (:data:`BAD_INPUT_IN_A_PROCESS`) runs ``tools/export_backbone.py``
in a real process, as a shell runs it, and so does the README's export line in a fresh clone.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
import torchvision
from safetensors import safe_open
from safetensors.torch import load_file

from pretrain.config import load_config
from pretrain.engine.checkpoint import AtomicCheckpointer
from pretrain.modeling import build_model
from tests.helpers import ROOT
from tests.helpers.checkpoints import CASES, bb, d2_names, randomise_bn, write
from tests.helpers.mistakes import ToolResult, run_main, run_tool
from transfer.cli.export_backbone import main as export_main
from transfer.export.backbone import export_backbone

REPO = ROOT
DEMO_CONFIG = REPO / "configs" / "pretrain" / "demo_fashion_mnist_r18.yaml"


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    return torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(0))


def _pooled(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(x)


def _without_fc(model: torchvision.models.ResNet) -> torch.nn.Module:
    """The backbone the checkpoint was written from, as pooled features (fc = Identity)."""
    out = copy.deepcopy(model)
    out.fc = torch.nn.Identity()
    return out


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    assert got.shape == expected.shape
    return float((got - expected).abs().max()) <= 1e-5 * max(1.0, float(expected.abs().max()))


def _torchvision_from(path: Path, arch: str) -> torch.nn.Module:
    model = torchvision.models.__dict__[arch]()
    model.fc = torch.nn.Identity()
    state = (
        load_file(str(path))
        if path.suffix == ".safetensors"
        else torch.load(path, weights_only=True)
    )
    model.load_state_dict(state, strict=True)
    return model


def _timm_from(path: Path, arch: str) -> torch.nn.Module:
    model = timm.create_model(arch, pretrained=False, num_classes=0)
    state = (
        load_file(str(path))
        if path.suffix == ".safetensors"
        else torch.load(path, weights_only=True)
    )
    model.load_state_dict(state, strict=True)
    return model


def _demo_model(stem: str = "imagenet") -> torch.nn.Module:
    """This project's pretraining model as the demo config builds it (queue shrunk)."""
    cfg = load_config(
        str(DEMO_CONFIG),
        ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x", "MODEL.QUEUE_SIZE", 256, "MODEL.STEM", stem],
    )
    torch.manual_seed(3)
    model = build_model(cfg)
    randomise_bn(model.encoder_q.backbone, seed=4)
    return model


def _save_ours(model: torch.nn.Module, folder: Path, iteration: int = 7) -> Path:
    """As the trainer saves: AtomicCheckpointer, {"model": ..., "iteration": ...}."""
    AtomicCheckpointer(model, str(folder)).save("model_final", iteration=iteration)
    return folder / "model_final.pth"


# ---------------------------------------------------------------------------------------------
# same features as the checkpoint's own backbone


def test_timm_and_torchvision_resnets_share_every_name():
    """Why --format timm writes the same dict: the names agree (and the shapes)."""
    for arch in ("resnet18", "resnet50"):
        tv = {k: v.shape for k, v in torchvision.models.__dict__[arch]().state_dict().items()}
        tv = {k: s for k, s in tv.items() if not k.startswith("fc.")}
        tm = timm.create_model(arch, pretrained=False, num_classes=0).state_dict()
        assert {k: v.shape for k, v in tm.items()} == tv


@pytest.mark.parametrize("safetensors", [False, True], ids=["pth", "safetensors"])
def test_our_checkpoint_exports_to_the_same_features(safetensors, image, tmp_path):
    model = _demo_model()
    ckpt = _save_ours(model, tmp_path / "run")
    expected = _pooled(model.encoder_q.backbone, image)
    for fmt, build in (("torchvision", _torchvision_from), ("timm", _timm_from)):
        out = tmp_path / f"{fmt}.{'safetensors' if safetensors else 'pth'}"
        report = export_backbone(str(ckpt), str(out), fmt, safetensors=safetensors)
        assert (report.layout, report.arch) == ("lorac", "resnet18")
        assert _close(_pooled(build(out, "resnet18"), image), expected), fmt
        if safetensors:
            with safe_open(str(out), framework="pt") as f:
                meta = f.metadata()
            assert not (tmp_path / f"{out.name}.json").exists()
        else:
            meta = json.loads((tmp_path / f"{out.name}.json").read_text())
        assert meta["source_layout"] == "lorac" and meta["iteration"] == "7"
        assert meta["target"] == fmt and meta["arch"] == "resnet18"


@pytest.mark.parametrize("case", sorted(CASES))
def test_public_layouts_export_to_the_same_features(case, net, other, image, tmp_path):
    layout, suffix, build = CASES[case]
    src = tmp_path / f"{case}{suffix}"
    write(src, build(net, other))
    expected = _pooled(_without_fc(net), image)
    tv, tm = tmp_path / "tv.pth", tmp_path / "timm.safetensors"
    assert export_backbone(str(src), str(tv)).layout == layout
    export_backbone(str(src), str(tm), "timm", safetensors=True)
    assert _close(_pooled(_torchvision_from(tv, "resnet18"), image), expected)
    assert _close(_pooled(_timm_from(tm, "resnet18"), image), expected)
    assert sorted(os.listdir(tmp_path)) == sorted([src.name, "tv.pth", "tv.pth.json", tm.name])


def test_comparison_detects_a_swapped_tensor(net, image, tmp_path):
    """The feature check can fail: two BN statistics swapped in the file change the features."""
    sd = bb(net)
    a, b = "layer3.0.bn1.running_mean", "layer3.0.bn2.running_mean"
    sd[a], sd[b] = sd[b].clone(), sd[a].clone()
    src, out = tmp_path / "swapped.pth", tmp_path / "out.pth"
    torch.save(sd, src)
    export_backbone(str(src), str(out))
    expected = _pooled(_without_fc(net), image)
    assert not _close(_pooled(_torchvision_from(out, "resnet18"), image), expected)


def test_resnet50_depth_is_read_from_the_keys(image, tmp_path):
    torch.manual_seed(1)
    r50 = randomise_bn(torchvision.models.resnet50(), seed=2)
    src, out = tmp_path / "moco.pth.tar", tmp_path / "r50.safetensors"
    write(src, CASES["moco"][2](r50, r50))
    report = export_backbone(str(src), str(out), safetensors=True)
    assert report.arch == "resnet50"
    state = load_file(str(out))
    assert len(state) == len(bb(r50)) and "fc.weight" not in state
    x = image[:1]
    assert _close(_pooled(_torchvision_from(out, "resnet50"), x), _pooled(_without_fc(r50), x))
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata()["epoch"] == "200"


# ---------------------------------------------------------------------------------------------
# refusals: exit 2, one line naming the file, no output


def _cli(*args: object, in_a_process: bool = False) -> ToolResult:
    """``tools/export_backbone.py args``: its ``main`` in this process, or a real process."""
    if in_a_process:
        return run_tool(["tools/export_backbone.py", *map(str, args)])
    return run_main(export_main, [*map(str, args)])


def test_cli_exports_and_reports(net, other, tmp_path):
    src = tmp_path / "in" / "ckpt.pth"
    src.parent.mkdir()
    write(src, CASES["lorac"][2](net, other))
    out = tmp_path / "out" / "r18.safetensors"
    result = _cli(src, out, "--format", "timm", "--safetensors")
    assert result.returncode == 0, result.stderr
    assert "lorac layout, resnet18" in result.stdout and str(out) in result.stdout
    assert "iteration=3" in result.stdout
    assert len(load_file(str(out))) == len(bb(net))


def _vit(path: Path) -> None:
    """A DeiT-style ViT checkpoint: {"model": ...} with patch_embed/blocks/head."""
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10, depth=2)
    torch.save({"model": vit.state_dict(), "epoch": 300}, path)


def _detector(path: Path, net: torch.nn.Module) -> None:
    """A fine-tuned detectron2 model_final.pth: ResNet under backbone.bottom_up. plus FPN and
    heads, no __author__ (its stride placement is not known)."""
    model = {k: torch.as_tensor(v) for k, v in d2_names(bb(net), "backbone.bottom_up.").items()}
    model |= {"backbone.fpn_lateral2.weight": torch.zeros(4, 64, 1, 1)}
    model |= {"roi_heads.box_predictor.cls_score.weight": torch.zeros(3, 8)}
    torch.save({"model": model, "iteration": 90000}, path)


BAD_INPUTS = {
    # name: (file name, writer(path, net, tmp_path), words the message must hold)
    "truncated": ("model_final.pth", None, ["incomplete checkpoint, truncated"]),
    "vit": ("deit_tiny.pth", lambda p, n: _vit(p), ["no ResNet backbone in a known layout"]),
    "detectron2-detector": (
        "model_final.pth",
        _detector,
        ["detectron2 layout", "roi_heads", "STRIDE_IN_1X1"],
    ),
    "detectron2-caffe2": ("R-50.pkl", None, ["detectron2-caffe2 layout", "1x1"]),
    "small-stem": ("model_final.pth", None, ["'small' stem", "conv1.weight"]),
    "missing": ("nothing.pth", None, ["no such checkpoint file"]),
}
# the bad input that also shows the entry point, the one line on stderr (no warning beside it)
# and the exit status of a real process
BAD_INPUT_IN_A_PROCESS = "truncated"


@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_bad_input_exits_2_naming_the_file_without_output(kind, net, other, tmp_path):
    name, writer, words = BAD_INPUTS[kind]
    src = tmp_path / "in" / name
    src.parent.mkdir()
    if kind == "truncated":
        write(src, CASES["lorac"][2](net, other))
        src.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    elif kind == "detectron2-caffe2":
        blobs = {"conv1_w": torch.zeros(64, 3, 7, 7).numpy()}
        blobs |= {"res2_0_branch2a_w": torch.zeros(64, 64, 1, 1).numpy()}
        write(src, {"blobs": blobs})
    elif kind == "small-stem":
        _save_ours(_demo_model("small"), src.parent)
    elif writer is not None:
        writer(src, net)
    out_dir = tmp_path / "out"
    for args in ([out_dir / "r.pth"], [out_dir / "r.safetensors", "--safetensors"]):
        result = _cli(src, *args, in_a_process=kind == BAD_INPUT_IN_A_PROCESS)
        assert result.returncode == 2, (result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert str(src) in lines[0] and "Traceback" not in result.stderr
        for word in words:
            assert word in lines[0], lines[0]
        assert not out_dir.exists() or os.listdir(out_dir) == []


@pytest.mark.parametrize(
    ("output", "flags"), [("r.pth", ["--safetensors"]), ("r.safetensors", [])], ids=["pth", "st"]
)
def test_output_suffix_must_match_safetensors_flag(output, flags, net, tmp_path):
    src = tmp_path / "tv.pth"
    torch.save(net.state_dict(), src)
    result = _cli(src, tmp_path / output, *flags)
    assert result.returncode == 2 and str(tmp_path / output) in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["tv.pth"]


def test_unwritable_output_leaves_nothing(net, tmp_path):
    src = tmp_path / "tv.pth"
    torch.save(net.state_dict(), src)
    (tmp_path / "file").write_text("a file, not a folder")
    result = _cli(src, tmp_path / "file" / "r.pth")
    assert result.returncode == 2 and "file/r.pth" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["file", "tv.pth"]


# ---------------------------------------------------------------------------------------------
# a fresh clone: torch.hub and the README's lines, as written


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """``git clone`` of this repository at HEAD (committed files only, as a user gets them)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path_factory.mktemp("clone") / "lorac"
    subprocess.run(["git", "clone", "-q", str(REPO), str(root)], check=True, timeout=300)
    return root


def _clone_env(clone: Path) -> dict[str, str]:
    """The clone's code first (as ``pip install -e .`` in the clone would give), this Python."""
    env = dict(os.environ, PYTHONPATH=str(clone))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _hub_features(
    clone: Path, entry: str, weights: list[str | None], cwd: Path
) -> list[torch.Tensor]:
    """torch.hub.load(clone, entry, source="local", weights=w) for each ``w`` of ``weights``, one
    after the other in one new process (each load imports the clone's hubconf.py afresh); the
    features of a fixed input of each, saved to a file."""
    out = cwd / "features.pt"
    code = (
        "import sys, torch\n"
        "x = torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(0))\n"
        "features = []\n"
        f"for w in {weights!r}:\n"
        f"    m = torch.hub.load({str(clone)!r}, {entry!r}, source='local', weights=w)\n"
        "    assert isinstance(m.fc, torch.nn.Identity)\n"
        "    with torch.no_grad():\n"
        "        features.append(m.eval()(x))\n"
        f"torch.save(features, {str(out)!r})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=_clone_env(clone),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return torch.load(out, weights_only=True)


def test_hub_loads_exports_and_checkpoints_in_a_fresh_clone(clone, image, tmp_path):
    torch.manual_seed(1)
    r50 = randomise_bn(torchvision.models.resnet50(), seed=2)
    src = tmp_path / "moco.pth.tar"
    write(src, CASES["moco"][2](r50, r50))
    exported = tmp_path / "r50.pth"
    export_backbone(str(src), str(exported))
    expected = _pooled(_without_fc(r50), image)
    # an export (torch only), a release (the project's reader), no weights
    weights = [str(exported), str(src), None]
    *got, random = _hub_features(clone, "lorac_resnet50", weights, tmp_path)
    for path, features in zip(weights[:2], got, strict=True):
        assert _close(features, expected), path
    assert random.shape == expected.shape and not _close(random, expected)


def test_hub_resnet18_with_our_checkpoint(clone, image, tmp_path):
    model = _demo_model()
    ckpt = _save_ours(model, tmp_path / "run")
    [got] = _hub_features(clone, "lorac_resnet18", [str(ckpt)], tmp_path)
    assert _close(got, _pooled(model.encoder_q.backbone, image))


def _readme_block(marker: str) -> str:
    """The fenced code block after ``<!-- marker -->`` in README.md."""
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- {marker} -->\s*```(\w+)\n(.*?)```", text, re.S)
    assert m, f"README.md: no code block after <!-- {marker} -->"
    return m.group(2)


def test_readme_export_and_hub_lines_run_as_written(clone, image):
    """The README's two lines, unchanged, in a fresh clone where `make demo` has written
    output/demo/model_final.pth (here: this project's model saved by the trainer's checkpointer)."""
    export, hub = _readme_block("export-example"), _readme_block("hub-example")
    assert "output/demo/model_final.pth" in export
    model = _demo_model()
    _save_ours(model, clone / "output" / "demo")
    env = _clone_env(clone)
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", export],
        capture_output=True,
        text=True,
        cwd=clone,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    check = "\nx = torch.randn(2, 3, 64, 80, generator=torch.Generator().manual_seed(0))\n"
    check += "torch.save(model.eval()(x).detach(), 'readme_features.pt')\n"
    run = subprocess.run(
        [sys.executable, "-c", hub + check],
        capture_output=True,
        text=True,
        cwd=clone,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    got = torch.load(clone / "readme_features.pt", weights_only=True)
    assert _close(got, _pooled(model.encoder_q.backbone, image))
