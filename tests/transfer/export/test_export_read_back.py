"""Every file ``tools/export_backbone.py`` writes is read back by the project's own readers: the
kNN / probe reader (``transfer.checkpoint.reader.load_backbone``) and the detectron2 converter
(``convert_checkpoint``) give the exported tensors; a name it cannot honour (``*.pkl``,
detectron2's pickle format) is one ``error:`` line and nothing written. A torch file that is
named ``.pkl`` anyway is read as the torch file it is, and a TorchScript archive is refused with
a line saying what it is and what to give instead, without torch's warning."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torchvision

from tests.helpers.mistakes import assert_user_error, run_main, snapshot
from transfer.checkpoint.reader import load_backbone
from transfer.cli import convert_to_d2, export_backbone
from transfer.detection.convert import convert_checkpoint
from transfer.export.backbone import export_backbone as export


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    net = torchvision.models.resnet18()
    torch.nn.init.normal_(net.bn1.running_mean)  # not the initial values: a copy is told apart
    path = tmp_path_factory.mktemp("ckpt") / "resnet18.pth"
    state = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    torch.save(net.state_dict(), path)
    return path, state


def test_each_export_format_is_read_back_by_the_converter_and_the_knn_reader(checkpoint, tmp_path):
    """A torch file (``.pth``; any other name is one too) and ``--safetensors``: the converter
    reads each (with the kNN's reader, ``load_backbone``) and its detectron2 ``.pkl`` holds the
    exported tensors."""
    source, state = checkpoint
    for name in ("r18.pth", "r18.safetensors"):
        out, d2 = tmp_path / name, tmp_path / f"{name}.d2.pkl"
        export(str(source), str(out), safetensors=name.endswith(".safetensors"))
        convert_checkpoint(str(out), str(d2))
        weights = load_backbone(str(d2))
        assert weights.arch == "resnet18" and weights.state_dict.keys() == state.keys()
        assert all(torch.equal(weights.state_dict[k], v) for k, v in state.items()), name


def test_an_export_named_pkl_is_one_error_line_naming_the_names_it_takes(checkpoint, tmp_path):
    before = snapshot(tmp_path)
    result = run_main(export_backbone.main, [str(checkpoint[0]), str(tmp_path / "out.pkl")])
    assert_user_error(result, before, tmp_path, match="out.pkl: a .pkl file is a detectron2")
    assert "*.pth" in result.stderr and "convert_to_d2" in result.stderr


def test_a_torch_file_named_pkl_is_read_as_a_torch_file(checkpoint, tmp_path):
    source, state = checkpoint
    renamed = tmp_path / "old_export.pkl"  # what export_backbone wrote for out.pkl before
    renamed.write_bytes(source.read_bytes())
    weights = load_backbone(str(renamed))
    assert all(torch.equal(weights.state_dict[k], v) for k, v in state.items())


def test_a_torchscript_file_given_to_the_converter_is_one_error_line_without_torch_warnings(
    tmp_path,
):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit's own deprecation notes, not the tool's
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), tmp_path / "r18.pt")
    before = snapshot(tmp_path)
    result = run_main(convert_to_d2.main, [str(tmp_path / "r18.pt"), str(tmp_path / "r18.pkl")])
    assert_user_error(result, before, tmp_path, match="r18.pt: a TorchScript archive")
    assert "torch.save(model.state_dict()" in result.stderr
    assert "Warning" not in result.output, result.output
