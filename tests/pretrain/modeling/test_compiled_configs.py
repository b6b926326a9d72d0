"""Every shipped pretraining config's forward and loss compile into one graph per beta phase and
are not recompiled by the steps after the first (tiny sizes, torch.compile's ``aot_eager``
backend: dynamo's guards and the autograd trace of a GPU run, without inductor's code
generation). A recompile on a GPU costs minutes of inductor per step."""

from __future__ import annotations

import math

import pytest
import torch
from torch._dynamo.utils import counters

from pretrain.config import load_config
from pretrain.config.step_policy import StepPolicy
from pretrain.data.loader import augment_views_on_device, build_batch_augment
from pretrain.modeling import build_model
from tests.helpers import ROOT

pytestmark = pytest.mark.compile  # make test-compile

CONFIGS = sorted(
    p.name for p in (ROOT / "configs" / "pretrain").glob("*.yaml") if not p.name.startswith("Base")
)
TINY = {"MODEL.DEVICE": "cpu", "MODEL.ARCH": "resnet18", "SOLVER.IMS_PER_BATCH": 4,
        "MODEL.QUEUE_SIZE": 16, "MODEL.HEAD_HIDDEN_DIM": 32, "MODEL.HEAD_OUT_DIM": 8,
        "DATASETS.ROOT": "/x", "INPUT.LARGE_SIZE": 32, "INPUT.SMALL_SIZE": 16,
        "SOLVER.COMPILE.ENABLED": True, "SOLVER.COMPILE.BACKEND": "aot_eager"}  # fmt: skip


def _tiny_model(config: str) -> tuple[torch.nn.Module, float, list[dict]]:
    cfg = load_config(str(ROOT / "configs" / "pretrain" / config),
                      [str(x) for kv in TINY.items() for x in kv])  # fmt: skip
    policy = StepPolicy.from_config(cfg)  # the trainer's, which it passes to the builders
    model = build_model(cfg, policy=policy).train()
    g = torch.Generator().manual_seed(0)
    augment = build_batch_augment(cfg, policy)
    batches = []
    for step in range(3):
        views = [torch.randint(0, 256, (4, 3, s, s), dtype=torch.uint8, generator=g)
                 for s in model.view_sizes]  # fmt: skip
        batch = {"views": views, "seeds": torch.arange(4) + 4 * step, "iteration": step}
        batch = augment_views_on_device(batch, augment, "cpu", apply_color=True)
        batches.append({"views": batch["views"], "log_stats": True})
    return model, float(cfg.LOSS.BETA), batches


@pytest.mark.parametrize("config", CONFIGS)
def test_forward_and_loss_compile_once_per_beta_phase(config):
    model, beta, batches = _tiny_model(config)
    torch._dynamo.reset()
    counters.clear()
    forward = torch.compile(model, fullgraph=True, dynamic=False, backend="aot_eager")
    phases = [math.inf] if math.isinf(beta) else [math.inf, beta]
    # without a prior (MoCo-M, MoCo-v2) the switch changes nothing the step computes: no graph
    # (torch 2.11 recompiled MoCo-M's for a beta its loss read but did not use)
    switch_graphs = 1 if model.criterion.prior.enabled else 0
    for phase in phases:
        model.set_beta(phase)
        before = counters["stats"]["unique_graphs"]
        for step, batch in enumerate(batches):
            forward(batch)["loss_contrastive"].backward()
            graphs = counters["stats"]["unique_graphs"] - before
            # at most one graph for the phase (none where it traces as the one before), made by
            # its first step
            most = 1 if phase == phases[0] else switch_graphs
            assert graphs <= most, f"beta {phase}, step {step}: {graphs} graphs in this phase"
            if step == 0:
                first = graphs
            assert graphs == first, f"beta {phase}, step {step}: recompiled"
    assert counters["stats"]["unique_graphs"] >= 1
