"""LORAC and its MoCo-M twin run the query encoder on the same views in the same BN batches.

For every shipped config whose prior is on, the twin is the same config with ``LOSS.PRIOR none``
(MoCo-M, paper Sec. 6). Each view is filled with its own index, a forward pre-hook on ``f``
records which views make up each of its input batches (one batch is one set of BatchNorm
statistics), and the two models must agree exactly. Before 2026-11 the prior added view 0 to f's
views in the one-key-crop demo recipe, for LORAC only: this test failed there.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pretrain.config import load_config
from pretrain.losses.priors import NoPrior
from pretrain.modeling import build_model
from tests.helpers import ROOT as REPO

ROOT = REPO / "configs" / "pretrain"
SHRINK = [
    "MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x", "INPUT.LARGE_SIZE", 32, "INPUT.SMALL_SIZE", 16,
    "MODEL.QUEUE_SIZE", 8, "MODEL.HEAD_HIDDEN_DIM", 16, "MODEL.HEAD_OUT_DIM", 8,
    "MODEL.CHANNELS_LAST", False, "SOLVER.IMS_PER_BATCH", 2,
]  # fmt: skip


def _with_prior() -> list[Path]:
    out = []
    for p in sorted(ROOT.glob("*.yaml")):
        if p.name.startswith("Base-"):
            continue
        if load_config(str(p), ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x"]).LOSS.PRIOR != "none":
            out.append(p)
    return out


LORAC_CONFIGS = _with_prior()


def f_batches(path: Path, opts: list) -> list[list[int]]:
    """The view index of every sample in each batch the query encoder receives, in order."""
    cfg = load_config(str(path), SHRINK + opts)
    model = build_model(cfg)
    seen: list[list[int]] = []

    def record(_module: torch.nn.Module, args: tuple) -> None:
        seen.append([int(v) for v in args[0][:, 0, 0, 0].round()])

    model.encoder_q.register_forward_pre_hook(record)
    b = 2
    views = [torch.full((b, 3, s, s), float(i)) for i, s in enumerate(model.view_sizes)]
    with torch.no_grad():
        model({"views": views})
    assert seen, "the query encoder never ran"
    return seen


def test_there_are_lorac_configs() -> None:
    names = {p.name for p in LORAC_CONFIGS}
    assert {"demo_fashion_mnist_r18.yaml", "in1k_r50_lorac_200ep.yaml"} <= names


@pytest.mark.parametrize("path", LORAC_CONFIGS, ids=lambda p: p.stem)
def test_mocom_twin_sees_the_same_views(path: Path) -> None:
    lorac = f_batches(path, [])
    twin = f_batches(path, ["LOSS.PRIOR", "none"])
    assert lorac == twin


def test_shipped_mocom_configs_are_twins_of_their_lorac_configs() -> None:
    """The MoCo-M configs the study and the docs compare with are the twins above."""
    pairs = [
        ("demo_fashion_mnist_r18.yaml", "demo_fashion_mnist_r18_mocom.yaml"),
        ("in1k_r50_lorac_200ep.yaml", "in1k_r50_mocom_200ep.yaml"),
    ]
    for lorac, mocom in pairs:
        cfg = load_config(str(ROOT / mocom), ["MODEL.DEVICE", "cpu", "DATASETS.ROOT", "/x"])
        assert isinstance(build_model(cfg).criterion.prior, NoPrior)
        assert f_batches(ROOT / mocom, []) == f_batches(ROOT / lorac, [])


def test_demo_query_encoder_sees_the_two_query_views_in_one_batch() -> None:
    """The demo (3 views of one size, one key crop): f on views 1 and 2 together, not view 0."""
    assert f_batches(ROOT / "demo_fashion_mnist_r18.yaml", []) == [[1, 1, 2, 2]]
