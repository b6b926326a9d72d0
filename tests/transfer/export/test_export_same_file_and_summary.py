"""``export_backbone`` and ``convert_to_d2`` refuse to write over their input (the export would lose
the provenance its metadata names), and ``convert_to_d2`` summarises the keys it drops on purpose (a
count and a few names; all with ``--verbose``; nothing for none). The tools' ``main`` runs in
this process (:func:`tests.helpers.mistakes.run_main`: exit status and output as a process's)."""

from __future__ import annotations

import os

import pytest
import torch
import torchvision

from tests.helpers.checkpoints import pre
from tests.helpers.mistakes import assert_user_error, run_main, snapshot, tool_main
from transfer.detection.convert import ConversionError, convert_checkpoint
from transfer.export.backbone import ExportError, export_backbone


def _moco(path) -> str:
    """A MoCo-style checkpoint: two encoders and a queue (100+ keys dropped on conversion)."""
    q, k = torchvision.models.resnet18(), torchvision.models.resnet18()
    state = pre("module.encoder_q.", q.state_dict()) | pre("module.encoder_k.", k.state_dict())
    torch.save({"state_dict": state | {"module.queue": torch.randn(8, 16)}}, path)
    return str(path)


def _backbone_only(path) -> str:
    """A torchvision ResNet-18 without its fc: nothing to drop."""
    sd = torchvision.models.resnet18().state_dict()
    torch.save({k: v for k, v in sd.items() if not k.startswith("fc.")}, path)
    return str(path)


def test_export_and_convert_refuse_to_overwrite_their_input(tmp_path):
    ckpt = _moco(tmp_path / "lorac.pth")
    link = tmp_path / "same.pth"
    os.symlink(ckpt, link)
    before = snapshot(tmp_path)
    for out in (ckpt, str(link), os.path.join(str(tmp_path), ".", "lorac.pth")):
        with pytest.raises(ExportError, match="is the input checkpoint"):
            export_backbone(ckpt, out)
        with pytest.raises(ConversionError, match="is the input checkpoint"):
            convert_checkpoint(ckpt, out)
    assert snapshot(tmp_path) == before
    # the export's metadata file <output>.json must not be the input either
    meta_input = tmp_path / "weights.pth.json"
    meta_input.write_bytes((tmp_path / "lorac.pth").read_bytes())
    before = snapshot(tmp_path)
    with pytest.raises(ExportError, match="is the input checkpoint"):
        export_backbone(str(meta_input), str(tmp_path / "weights.pth"))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("tool", ["tools/export_backbone.py", "tools/convert_to_d2.py"])
def test_the_tools_say_so_in_one_line(tmp_path, tool):
    ckpt = _moco(tmp_path / "lorac.pth")
    before = snapshot(tmp_path)
    r = run_main(tool_main(tool), [ckpt, ckpt])
    assert_user_error(r, before, tmp_path, match="is the input checkpoint")


def test_convert_summarises_dropped_keys(tmp_path):
    # every key but the query encoder's backbone: its fc, the whole key encoder and the queue
    n_tensors = len(torchvision.models.resnet18().state_dict())  # the backbone's and fc's 2
    n_dropped = 2 + n_tensors + 1
    convert = tool_main("tools/convert_to_d2.py")
    r = run_main(convert, [_moco(tmp_path / "m.pth"), str(tmp_path / "m.pkl")])
    assert r.returncode == 0, r.output
    assert len(r.stdout.splitlines()) == 3, r.stdout  # read, dropped (one line), wrote
    dropped = next(line for line in r.stdout.splitlines() if line.startswith("dropped"))
    assert dropped.startswith(f"dropped {n_dropped} keys on purpose (not part of the backbone): ")
    assert dropped.endswith(", ... (all of them with --verbose)")
    assert dropped.count("module.") == 5
    r = run_main(convert, ["--verbose", str(tmp_path / "m.pth"), str(tmp_path / "v.pkl")])
    assert r.returncode == 0 and r.stdout.count("module.") == n_dropped, r.output
    r = run_main(convert, [_backbone_only(tmp_path / "b.pth"), str(tmp_path / "b.pkl")])
    assert r.returncode == 0 and "dropped" not in r.stdout, r.output
