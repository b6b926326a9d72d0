"""Linear probe and semi-supervised fine-tuning: a few iterations on a tiny ImageFolder."""

from __future__ import annotations

import csv
import json
import os

import pytest
import torch

from tests.helpers.classification import QUICK, make_imagenet, single_thread  # noqa: F401
from transfer.classification.backbone import load_eval_backbone
from transfer.classification.config import load_config, semi_supervised_defaults
from transfer.classification.semi import run_semi_supervised
from transfer.cli import linear_probe, semi_supervised


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _jsonl(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_linear_probe_tool_trains_only_the_head(tmp_path, monkeypatch):
    """Proves: the tool runs the LORAC instant recipe end to end, the backbone (weights and
    BatchNorm statistics) is untouched while the head is trained, the cosine lr decays, the
    head checkpoint and Table 1 row are written, and a torchvision state dict is accepted."""
    data = make_imagenet(str(tmp_path / "imagenet"))
    backbone = load_eval_backbone(random_init="resnet18")
    ckpt = str(tmp_path / "r18_torchvision.pth")
    torch.save(
        backbone.model.state_dict()
        | {"fc.weight": torch.zeros(10, 512), "fc.bias": torch.zeros(10)},
        ckpt,
    )
    before = _snapshot(backbone.model)

    from transfer.classification import probe

    seen = {}
    real = probe.LinearProbe

    def spy(*a, **kw):
        seen["model"] = real(*a, **kw)
        return seen["model"]

    monkeypatch.setattr(probe, "LinearProbe", spy)
    out = str(tmp_path / "run")
    argv = [
        "--config-file",
        os.path.join(QUICK, "linear_instant.yaml"),
        "--checkpoint",
        ckpt,
        "--name",
        "R18",
        "--data-root",
        data,
        "--output-dir",
        out,
        "--device",
        "cpu",
        "--meta",
        "train. epoch=0",
    ]
    linear_probe.main(argv)

    model = seen["model"]
    after = _snapshot(model.backbone)
    assert all(torch.equal(before[k], after[k]) for k in before)  # incl. running_mean/var
    assert not torch.allclose(model.classifier.weight, torch.zeros_like(model.classifier.weight))
    metrics = _jsonl(os.path.join(out, "metrics.json"))
    lrs = [m["lr"] for m in metrics if "lr" in m]
    assert lrs[0] == pytest.approx(1.2) and lrs[-1] < lrs[0]
    assert os.path.isfile(os.path.join(out, "model_final.pth"))
    assert os.path.isfile(os.path.join(out, "config.yaml"))
    with open(os.path.join(out, "table1_linear.csv")) as f:
        (row,) = list(csv.DictReader(f))
    assert row["Method"] == "R18" and row["arch."] == "resnet18" and row["train. epoch"] == "0"
    assert 0.0 <= float(row["Top-1"]) <= 100.0 and float(row["Top-5"]) == pytest.approx(100.0)


def test_linear_probe_mocov2_step_schedule_and_class_list(tmp_path):
    """Proves the MoCo-v2 recipe's lr is 30 then x0.1 at 60% and 80% of training, and that a
    class-list file (ImageNet-100 style) restricts the classes of train and val."""
    data = make_imagenet(str(tmp_path / "imagenet"))
    class_list = tmp_path / "subset.txt"
    class_list.write_text("# two of three\nn01440764\nn01484850\n")
    out = str(tmp_path / "run")
    linear_probe.main(
        [
            "--config-file",
            os.path.join(QUICK, "linear_mocov2_instant.yaml"),
            "--random-init",
            "resnet18",
            "--data-root",
            data,
            "--output-dir",
            out,
            "DATA.CLASS_LIST",
            str(class_list),
        ]
    )
    lrs = [m["lr"] for m in _jsonl(os.path.join(out, "metrics.json")) if "lr" in m]
    assert lrs == pytest.approx([30.0, 30.0, 30.0, 3.0, 0.3])
    head = torch.load(os.path.join(out, "model_final.pth"), weights_only=True)["model"]
    assert head["weight"].shape == (2, 512)


def test_semi_supervised_sweep_fine_tunes_whole_network(tmp_path, monkeypatch):
    """Proves: only the images of the split file are trained on, each lr fine-tunes the
    backbone too (weights change), the backbone lr is the classifier lr / 250, every lr run
    starts from the pretrained weights (which stay untouched), and the best lr is chosen on
    held-out train images."""
    data = make_imagenet(str(tmp_path / "imagenet"))
    split = tmp_path / "1percent.txt"
    split.write_text("n01440764_0.JPEG\nn01443537_1.JPEG\nn01484850_2.JPEG\nn01484850_3.JPEG\n")
    cfg = load_config(
        semi_supervised_defaults(),
        os.path.join(QUICK, "semi_instant.yaml"),
        ["OUTPUT_DIR", str(tmp_path / "out"), "DATA.SPLIT_FILE", str(split)],
    )
    backbone = load_eval_backbone(random_init="resnet18")
    initial = _snapshot(backbone.model)
    from transfer.classification import semi

    models, real = [], semi.Classifier

    def spy(net, *a, **kw):
        assert all(torch.equal(v, initial[k]) for k, v in net.state_dict().items())
        models.append(real(net, *a, **kw))
        return models[-1]

    monkeypatch.setattr(semi, "Classifier", spy)
    res = run_semi_supervised(cfg, backbone, data, "cpu")

    assert res.lrs == [0.1, 1.0] and res.num_labelled == 4 and res.best_lr in res.lrs
    assert len(res.heldout_top1) == 2 and 0.0 <= res.top1 <= res.top5 <= 1.0
    assert len(models) == 2
    for m in models:  # each run changed the backbone ...
        assert not torch.equal(m.backbone.conv1.weight.detach(), initial["conv1.weight"])
    after = _snapshot(backbone.model)  # ... but not the pretrained model itself
    assert all(torch.equal(after[k], initial[k]) for k in initial)
    for lr in res.lrs:
        metrics = _jsonl(os.path.join(cfg.OUTPUT_DIR, f"lr_{lr:.4g}", "metrics.json"))
        # detectron2 logs the lr of the largest param group: the backbone's
        assert metrics[0]["lr"] == pytest.approx(lr / 250.0)
        assert metrics[0]["iteration"] == 0


def test_semi_supervised_tool_writes_table3(tmp_path):
    data = make_imagenet(str(tmp_path / "imagenet"))
    split = tmp_path / "10percent.txt"
    split.write_text("n01440764_0.JPEG\nn01443537_1.JPEG\nn01484850_2.JPEG\n")
    out = str(tmp_path / "run")
    semi_supervised.main(
        [
            "--config-file",
            os.path.join(QUICK, "semi_instant.yaml"),
            "--random-init",
            "resnet18",
            "--name",
            "rand",
            "--data-root",
            data,
            "--split-file",
            str(split),
            "--output-dir",
            out,
            "DATA.LABEL_PERCENT",
            "10",
            "SOLVER.LRS",
            "(0.5,)",
        ]
    )
    with open(os.path.join(out, "table3_semi.csv")) as f:
        (row,) = list(csv.DictReader(f))
    assert row["Model"] == "rand" and row["10% Top-1"] and row["1% Top-1"] == ""
    with open(os.path.join(out, "semi_results.json")) as f:
        saved = json.load(f)
    assert saved["results"]["lrs"] == [0.5] and saved["model"] == "rand"
    assert saved["config"]["SOLVER"]["LRS"] == [0.5]


def test_linear_probe_resume_continues_after_last_checkpoint(tmp_path):
    """Proves --resume restores the head, optimizer and scheduler from the run directory and
    continues at the next iteration instead of starting over (a run stopped after the checkpoint
    of iteration 1: no model_final.pth, no results.json)."""
    data = make_imagenet(str(tmp_path / "imagenet"))
    out = str(tmp_path / "run")
    argv = [
        "--config-file",
        os.path.join(QUICK, "linear_instant.yaml"),
        "--random-init",
        "resnet18",
        "--data-root",
        data,
        "--output-dir",
        out,
    ]
    opts = ["SOLVER.MAX_ITER", "4", "SOLVER.CHECKPOINT_PERIOD", "2"]
    linear_probe.main([*argv, *opts])
    for name in ("model_final.pth", "results.json"):
        os.unlink(os.path.join(out, name))
    with open(os.path.join(out, "last_checkpoint"), "w") as f:
        f.write("model_0000001.pth")
    assert torch.load(os.path.join(out, "model_0000001.pth"), weights_only=True)["iteration"] == 1
    logged = len(_jsonl(os.path.join(out, "metrics.json")))
    linear_probe.main(["--resume", *argv, *opts])
    with open(os.path.join(out, "log.txt")) as f:
        assert "resuming from iteration 2" in f.read()
    again = _jsonl(os.path.join(out, "metrics.json"))[logged:]
    assert [m["iteration"] for m in again if "lr" in m] == [2, 3]
    assert os.path.isfile(os.path.join(out, "results.json"))
