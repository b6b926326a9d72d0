"""The static step (SOLVER.STATIC_STEP, SOLVER.COMPILE): what a CUDA graph replay or a compiled
step needs, proven on the CPU.

* no host sync in a non-logging iteration, LORAC with its prior on included (the step counter of
  :mod:`pretrain.diagnostics.step_count`, which takes a GPU's paths: Jacobi for the nuclear norm);
* the same device ops (names, shapes, strides, dtypes, the constants passed to them) in two
  consecutive non-logging iterations of each beta phase, the learning rate written into its
  device tensor as the step's input; the beta switch is the only change of ops (one more
  variant: one new capture);
* the model's forward and loss trace into one graph (``torch._dynamo.explain``: 0 breaks), and
  a compiled step equals the eager one (float32, torch.compile's ``aot_eager`` backend: the
  traced graphs run by eager kernels), compiled twice over a run: once per beta phase.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from pretrain.config import load_config
from pretrain.config.step_policy import StepPolicy
from pretrain.data.loader import augment_views_on_device, build_batch_augment
from pretrain.diagnostics.step_count import measure
from pretrain.engine.trainer import PretrainTrainer
from pretrain.modeling import build_model
from tests.helpers import ROOT, tiny_opts

# one per distinct path of the step, on ResNet-18s (IN-1K's ResNet-50 runs the same code, and
# `make test-compile` traces every shipped config): LORAC (multi-crop, LARS, SyncBN, the prior
# switched on; MoCo-M is its beta = inf phase) and MoCo-v2 (two views, SGD, BN, no prior)
CONFIGS = ["in100_r18_lorac_beta2.yaml", "in100_r18_mocov2.yaml"]
STATIC = ["SOLVER.STATIC_STEP", "True"]


def _first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"op {i}: {str(x)[:300]}\n   vs {str(y)[:300]}"
    return f"{len(a)} ops vs {len(b)}"


def _sequences(config: str, procs: int, iters: tuple[int, ...], opts: list[str]) -> dict:
    m = measure(f"configs/pretrain/{config}", procs, extra_opts=STATIC + opts, record=iters)
    return m, {int(k): v for k, v in m["sequences"].items()}


@pytest.mark.parametrize("config", CONFIGS)
def test_the_static_step_makes_no_host_sync_and_repeats_its_ops(config):
    # 32 images, 8 a batch: 4 iterations an epoch; beta = inf at 0-3, the prior from 4 on
    opts = ["SOLVER.MAX_ITER", "7", "LOSS.BETA_INF_EPOCHS", "1.0"]
    m, seq = _sequences(config, 1, (2, 3, 4, 5), opts)
    assert m["host_syncs"] == 0, m["syncs_by_source"]
    assert m["ops"] > 1000  # the counter saw the steps
    assert seq[2] == seq[3], _first_difference(seq[2], seq[3])  # beta = inf
    assert seq[4] == seq[5], _first_difference(seq[4], seq[5])  # the prior on (LORAC)
    lorac = "lorac" in config
    assert (seq[3] != seq[4]) == lorac  # the switch: the prior's ops join (LORAC only)
    inputs = [op for op in seq[4] if op[1] == "input write"]
    assert [op[0] for op in inputs] == ["aten.fill_.Scalar"]  # the learning rate, nothing else


def test_the_eager_step_differs_from_step_to_step():
    """The counter can fail: the eager step's colour augmentation picks subsets on the host."""
    opts = ["SOLVER.MAX_ITER", "5", "SOLVER.STATIC_STEP", "False"]
    m = measure("configs/pretrain/in100_r18_mocov2.yaml", 1, extra_opts=opts, record=(2, 3))
    assert m["sequences"]["2"] != m["sequences"]["3"]


@pytest.mark.processes  # make test-processes
def test_two_processes_repeat_their_ops_with_syncbn_and_shufflebn():
    """LORAC on two gloo processes: SyncBN's collectives, ShuffleBN's static plan (one
    all-to-all of equal splits), DDP's buckets: after DDP's first iterations every step is the
    same, within each beta phase."""
    # 32 images, 16 a global batch: 2 iterations an epoch; beta = inf at 0-5, the prior from 6
    opts = ["SOLVER.MAX_ITER", "9", "LOSS.BETA_INF_EPOCHS", "3.0"]
    m, seq = _sequences("in100_r18_lorac_beta2.yaml", 2, (4, 5, 6, 7), opts)
    assert m["host_syncs_per_rank"] == [0, 0], m["syncs_by_source"]
    assert not m["layout_mismatches"]
    assert any("alltoall_base_" in name for name in m["collectives"])  # the static plan's
    assert seq[4] == seq[5], _first_difference(seq[4], seq[5])
    assert seq[6] == seq[7], _first_difference(seq[6], seq[7])
    alltoall = [op for op in seq[6] if op[0].startswith("c10d.alltoall_base_")]
    assert alltoall and all(op[1][3:5] == [[], []] for op in alltoall)  # no split sizes


def _static_batch(config: str, beta: float) -> tuple[torch.nn.Module, dict]:
    opts = {"MODEL.DEVICE": "cpu", "SOLVER.IMS_PER_BATCH": 4, "MODEL.QUEUE_SIZE": 16,
            "DATASETS.ROOT": "/x", "DATASETS.CLASS_LIST": "", "INPUT.LARGE_SIZE": 32,
            "INPUT.SMALL_SIZE": 24, "SOLVER.STATIC_STEP": True}  # fmt: skip
    if "demo" in config:
        del opts["DATASETS.CLASS_LIST"], opts["INPUT.LARGE_SIZE"], opts["INPUT.SMALL_SIZE"]
    cfg = load_config(str(ROOT / "configs" / "pretrain" / config),
                      [str(x) for kv in opts.items() for x in kv])  # fmt: skip
    policy = StepPolicy.from_config(cfg)  # the trainer's, which it passes to the builders
    model = build_model(cfg, policy=policy)
    model.set_beta(beta)
    g = torch.Generator().manual_seed(0)
    views = [torch.randint(0, 256, (4, 3, s, s), dtype=torch.uint8, generator=g)
             for s in model.view_sizes]  # fmt: skip
    batch = {"views": views, "seeds": torch.arange(4), "iteration": 0}
    batch = augment_views_on_device(
        batch, build_batch_augment(cfg, policy), "cpu", apply_color=True
    )
    return model, {"views": batch["views"], "log_stats": True}


@pytest.mark.compile  # make test-compile, with every shipped config
@pytest.mark.parametrize(
    "config",
    ["in100_r18_lorac_beta2.yaml", "demo_fashion_mnist_r18.yaml", "in100_r18_lorac_bs.yaml"],
)
def test_forward_and_loss_trace_into_one_graph(config):
    """With the prior on, and off (beta = inf: the warm-up's graph); one config per Q: the
    multi-crop instance Q (IN-1K's too), the demo's queries-only Q, the batchwise prior's P."""
    model, batch = _static_batch(config, 2.0)

    def step(b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(b)["loss_contrastive"]

    for beta in (2.0, math.inf):
        model.set_beta(beta)
        explained = torch._dynamo.explain(step)(batch)
        assert explained.graph_break_count == 0, [r.reason for r in explained.break_reasons]
        assert explained.graph_count == 1


def _train(tmp_path: Path, image_folder: Path, name: str, **extra) -> list[dict]:
    out = tmp_path / name
    # 24 images, 8 a batch: beta = inf at iterations 0-1, the prior on at 2-3
    opts = {"SOLVER.MAX_ITER": 4, "SOLVER.LOG_PERIOD": 1, "LOSS.BETA_INF_EPOCHS": 0.5,
            "SOLVER.AMP.ENABLED": False, "SOLVER.STATIC_STEP": True, **extra}  # fmt: skip
    cfg = load_config(str(ROOT / "configs" / "pretrain" / "demo_fashion_mnist_r18.yaml"),
                      tiny_opts(image_folder, out, **opts))  # fmt: skip
    trainer = PretrainTrainer(cfg)
    trainer.train()
    state = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    lines = [json.loads(x) for x in (out / "metrics.json").read_text().splitlines()]
    return [x for x in lines if "total_loss" in x], state


# bfloat16: make test-compile (CI); float32 here
@pytest.mark.parametrize("amp", [False, pytest.param(True, marks=pytest.mark.compile)])
def test_the_compiled_step_equals_the_eager_one_and_compiles_once_per_beta_phase(
    tmp_path, image_folder, amp, caplog
):
    """float32: equal to float rounding, weights included; bfloat16 autocast (channels_last, as
    the GPU configs): the first iterations' losses within bfloat16's rounding (the traced
    graph's decompositions round differently), and no recompile after the first step (the key
    encoder's bfloat16 weights are cast in the graph, not kept from the first call)."""
    torch.compiler.reset()
    amp_opts = {"SOLVER.AMP.ENABLED": amp, "MODEL.CHANNELS_LAST": amp}
    eager, eager_state = _train(tmp_path, image_folder, "eager", **amp_opts)
    counters.clear()
    with caplog.at_level(logging.INFO, logger="pretrain.engine.trainer"):
        compiled, compiled_state = _train(
            tmp_path, image_folder, "compiled", **amp_opts,
            **{"SOLVER.COMPILE.ENABLED": True, "SOLVER.COMPILE.BACKEND": "aot_eager"},
        )  # fmt: skip
    # the waits say what they are: the step's kind, each phase's compile and its duration
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("pretraining with the compiled step (aot_eager") for m in said)
    for phase in ("beta = inf", "the prior on"):
        assert sum(m.startswith(f"compiling the step (aot_eager, {phase})") for m in said) == 1
        assert any(re.match(rf"compiled the step \({re.escape(phase)}\) in [0-9.]+ s", m)
                   for m in said), said  # fmt: skip
    # the beta switch's recompile told in one line with its cause (the beta its guard read);
    # none after a phase's first step
    switch = [m for m in said if m.startswith("recompiling the step at iteration 2 (its beta")]
    assert len(switch) == 1 and "criterion" in switch[0] and "beta == inf" in switch[0], said
    assert sum(m.startswith("recompil") for m in said) == 1, said
    betas = [x["beta"] for x in compiled]
    assert math.inf in betas and 2.0 in betas  # both phases ran
    # the model: one graph per beta phase; the colour augmentation: one; no recompile per step
    assert counters["stats"]["unique_graphs"] == 3
    if amp:
        for e, c in list(zip(eager, compiled, strict=True))[:2]:
            assert c["total_loss"] == pytest.approx(e["total_loss"], rel=2e-2), (e, c)
        return
    # float32 rounding (torch 2.11's traced graph: the first loss 1.0e-6 relative off, weights
    # and queues up to 3.1e-6 after 4 steps)
    for e, c in zip(eager, compiled, strict=True):
        assert c["total_loss"] == pytest.approx(e["total_loss"], rel=1e-5), (e, c)
        assert c["nuclear_norm"] == pytest.approx(e["nuclear_norm"], rel=1e-5), (e, c)
    for k, v in eager_state.items():
        torch.testing.assert_close(compiled_state[k], v, rtol=1e-5, atol=1e-5, msg=k)
