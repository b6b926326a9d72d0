"""The training step as a GPU would run it: no host sync outside the logging period, few ops.

Counted with ``benchmarks/bench_step.py`` (a ``TorchDispatchMode`` over one non-logging
iteration, only ops on tensors that would live on the GPU). Before 2026-11 a demo iteration made
7 host syncs (the queue pointer per key crop, the loss's finiteness, three logged metrics,
detectron2's loss read) and the IN-1K LORAC iteration 5,396 device ops.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from detectron2.engine import HookBase

from benchmarks.bench_step import measure
from pretrain.config import load_config
from pretrain.data.color import BatchColorAugment, ColorSpec, sample_color_params
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, tiny_opts

DEMO_CONFIG = str(ROOT / "configs" / "pretrain" / "demo_fashion_mnist_r18.yaml")


@pytest.mark.parametrize(
    "config",
    ["configs/pretrain/demo_fashion_mnist_r18.yaml", "configs/pretrain/in100_r18_lorac_beta2.yaml"],
)
def test_no_host_sync_in_a_non_logging_iteration(config):
    m = measure(config, procs=1)
    assert m["ops"] > 500  # the counter saw the step (forward, backward, optimiser)
    assert m["host_syncs"] == 0, m["syncs_by_source"]


def test_the_counter_sees_a_host_sync():
    """The same measurement with one ``.item()`` added to the step reports exactly it."""

    original = PretrainTrainer._watch_finite

    def with_a_read(self, total):
        original(self, total)
        total.item()

    PretrainTrainer._watch_finite = with_a_read
    try:
        m = measure("configs/pretrain/demo_fashion_mnist_r18.yaml", procs=1)
    finally:
        PretrainTrainer._watch_finite = original
    assert m["host_syncs"] == 1
    assert any("with_a_read" in where for where in m["syncs_by_source"])


@pytest.mark.parametrize("given", [False, True])
def test_one_pass_colour_augmentation_equals_the_chunked_one(given):
    """One pipeline per resolution (the GPU path) gives the CPU path's values up to float
    rounding (the blur's taps are normalised over a longer, zero-padded kernel there)."""
    g = torch.Generator().manual_seed(0)
    views = [torch.randint(0, 256, (5, 3, s, s), dtype=torch.uint8, generator=g) for s in (24,) * 3]
    views += [torch.randint(0, 256, (5, 3, 12, 12), dtype=torch.uint8, generator=g)]
    spec = ColorSpec(blur_prob=0.7)
    params = [sample_color_params(5, spec, torch.Generator().manual_seed(i)) for i in range(4)]
    outs = []
    for one_pass in (False, True):
        augment = BatchColorAugment(spec, cpu_chunk_pixels=24 * 24 * 2, one_pass=one_pass)
        kwargs = {"params": params} if given else {}
        outs.append(augment(views, torch.Generator().manual_seed(1), **kwargs))
    for chunked, one in zip(*outs, strict=True):
        torch.testing.assert_close(one, chunked, rtol=0, atol=1e-5)


def test_non_finite_loss_between_logs_is_never_checkpointed(tmp_path, image_folder):
    """The finiteness flag stays on the device; it is read at the next logging or checkpointing
    iteration, and the error names the first bad iteration and the intact checkpoint."""
    out = tmp_path / "run"
    opts = {"SOLVER.MAX_ITER": 12, "SOLVER.LOG_PERIOD": 5, "SOLVER.CHECKPOINT_PERIOD": 4}
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **opts))
    trainer = PretrainTrainer(cfg)

    class _Poison(HookBase):
        def before_step(self):
            if self.trainer.iter == 5:  # after the checkpoint of iteration 3 and the log of 4
                with torch.no_grad():
                    next(self.trainer.model.encoder_q.parameters()).fill_(float("nan"))

    trainer.register_hooks([_Poison()])
    with pytest.raises(FloatingPointError, match="non-finite loss at iteration 5"):
        trainer.train()
    assert (out / "last_checkpoint").read_text() == "model_0000003.pth"
    assert not (out / "model_0000007.pth").exists()
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    # no loss of the bad iterations was logged (the timer's and lr's values are)
    assert max(r["iteration"] for r in lines if "total_loss" in r) == 4


def test_queue_pointer_is_restored_from_a_checkpoint(tmp_path, image_folder):
    """The host-side queue pointer is read back from the loaded buffer."""
    out = tmp_path / "q"
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **{"MODEL.QUEUE_SIZE": 64}))
    trainer = PretrainTrainer(cfg)
    trainer.train()  # 6 iterations of 8: the pointer is at 48
    model = trainer.model
    assert model.queue_ptr.tolist() == [48] and model._queue_ptr == [48]
    fresh = PretrainTrainer(cfg)
    assert fresh.resume()
    assert fresh.model._queue_ptr is None
    fresh.model._enqueue(0, torch.zeros(8, model.queues.shape[-1]))
    assert fresh.model._queue_ptr == [56] and fresh.model.queue_ptr.tolist() == [56]


def test_flush_covers_every_logged_iteration(tmp_path, image_folder):
    """metrics.json holds the iterations the writers act on, with the model's metrics."""
    out = tmp_path / "m"
    opts = {"SOLVER.MAX_ITER": 7, "SOLVER.LOG_PERIOD": 3, "SOLVER.CHECKPOINT_PERIOD": 100}
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **opts))
    PretrainTrainer(cfg).train()
    lines = [json.loads(line) for line in Path(out / "metrics.json").read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [2, 5, 6]
    assert all(
        {"total_loss", "inst_acc", "nuclear_norm", "images_per_sec"} <= r.keys() for r in lines
    )
