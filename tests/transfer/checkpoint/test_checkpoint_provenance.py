"""What names a model in the results tables: its run's name and method
(transfer/checkpoint/provenance.py) and the hash of its weights (transfer/checkpoint/digest.py)."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision

from pretrain.config import get_cfg, load_config
from tests.helpers.checkpoints import CASES, randomise_bn, write
from transfer.checkpoint.digest import weights_digest
from transfer.checkpoint.provenance import checkpoint_method, method_of, run_label
from transfer.checkpoint.reader import load_backbone
from transfer.shipped_configs import config_path


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("out/in100_lorac/model_final.pth", "in100_lorac"),
        ("out/in100_lorac/model_0004999.pth", "in100_lorac/model_0004999"),
        ("out/in100_lorac/model_final.pkl", "in100_lorac"),  # converted beside its run
        ("downloads/lorac_200ep.pth", "lorac_200ep"),
        ("downloads/moco_v2_800ep_pretrain.pth.tar", "moco_v2_800ep_pretrain"),
        ("downloads/model_best.pth", "model_best"),  # not a name fvcore's checkpointer writes
    ],
)
def test_run_label_names_a_run_checkpoint_after_its_directory(path, label):
    assert run_label(path) == label


def test_run_label_of_a_directory_is_its_name(tmp_path):
    (tmp_path / "run").mkdir()
    assert run_label(str(tmp_path / "run") + "/") == "run"


@pytest.mark.parametrize(
    ("config", "method"),
    [
        ("demo_fashion_mnist_r18.yaml", "LORAC"),
        ("demo_fashion_mnist_r18_mocom.yaml", "MoCo-M"),
        ("demo_fashion_mnist_r18_mocov2.yaml", "MoCo-v2"),
        ("in100_r18_lorac_beta2.yaml", "LORAC"),
        ("in100_r18_gaussian.yaml", "Gauss."),
        ("in100_r18_lorac_bs.yaml", "LORAC-bs"),
        ("in100_r18_lsftmx_c3.yaml", "L-sftmx-c"),
        ("in100_r18_mocom.yaml", "MoCo-M"),
        ("in100_r18_mocov2.yaml", "MoCo-v2"),
        ("in1k_r50_lorac_200ep.yaml", "LORAC"),
        ("in1k_r50_mocom_200ep.yaml", "MoCo-M"),
        ("in1k_r50_mocov2_200ep.yaml", "MoCo-v2"),
    ],
)
def test_method_of_every_shipped_method_config(config, method):
    """Proves each method of paper Table 5 is read back from its shipped config by the names
    the paper uses, from the CfgNode and from the plain dict of its dumped config.yaml."""
    import yaml

    cfg = load_config(config_path(f"pretrain/{config}"))
    assert method_of(cfg) == method
    assert method_of(yaml.safe_load(cfg.dump())) == method


def test_method_of_beta_inf_and_other_configs():
    cfg = get_cfg()
    assert method_of(cfg) == "LORAC"
    cfg.LOSS.BETA = math.inf  # every prior off: MoCo-M, whatever LOSS.PRIOR says
    assert method_of(cfg) == "MoCo-M"
    assert method_of({"LOSS": {"PRIOR": "laplace", "BETA": "inf"}, "INPUT": cfg.INPUT}) == "MoCo-M"
    assert method_of({"MODEL": {"WEIGHTS": "x.pkl"}, "SOLVER": {}}) == ""  # detection's
    assert method_of({"LOSS": None, "INPUT": {}}) == ""


def test_checkpoint_method_reads_the_run_directory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ckpt = str(run / "model_final.pth")
    assert checkpoint_method(ckpt) == ""  # no config.yaml: a downloaded release
    cfg = get_cfg()
    cfg.LOSS.PRIOR = "none"
    (run / "config.yaml").write_text(cfg.dump())
    assert checkpoint_method(ckpt) == "MoCo-M"
    (run / "config.yaml").write_text("MODEL: [unclosed\n")
    assert checkpoint_method(ckpt) == ""
    (run / "config.yaml").write_text("- a list\n")
    assert checkpoint_method(ckpt) == ""


def test_weights_digest_reads_the_tensors_not_the_file(tmp_path):
    """Proves the same weights hash alike in this project's layout and as detectron2 weights
    (other names, numpy arrays, no num_batches_tracked), and that one changed value, another
    dtype or another model hash differently."""
    torch.manual_seed(0)
    net = randomise_bn(torchvision.models.resnet18(), 1)
    other = randomise_bn(torchvision.models.resnet18(), 2)
    digests = {}
    for case in ("lorac", "d2-torchvision-script", "torchvision"):
        _, suffix, build = CASES[case]
        path = tmp_path / f"{case}{suffix}"
        write(path, build(net, other))
        digests[case] = weights_digest(load_backbone(str(path)).state_dict)
    assert len(set(digests.values())) == 1 and len(digests["lorac"]) == 8
    sd = {k: v.clone() for k, v in net.state_dict().items() if not k.startswith("fc.")}
    assert weights_digest(sd) == digests["lorac"]
    sd["layer1.0.bn1.num_batches_tracked"].fill_(7)
    assert weights_digest(sd) == digests["lorac"]
    sd["conv1.weight"][0, 0, 0, 0] += 1e-6
    assert weights_digest(sd) != digests["lorac"]
    half = {k: v.half() for k, v in net.state_dict().items() if not k.startswith("fc.")}
    assert weights_digest(half) != digests["lorac"]
    assert weights_digest(other.state_dict()) != weights_digest(net.state_dict())
