"""The training step as a GPU would run it: no host sync outside the logging period.

Counted with :func:`pretrain.diagnostics.step_count.measure` (a ``TorchDispatchMode`` over one
non-logging iteration, only ops on tensors that would live on the GPU). One config per distinct
path: the demo's LORAC (one key crop, the prior), MoCo-M (its views without the prior) and
MoCo-v2 (two views, SGD) on one process; IN-100 LORAC (multi-crop, two key crops) on two.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from detectron2.engine import HookBase

from pretrain.config import load_config
from pretrain.data.color import BatchColorAugment, Blur, ColorSpec, sample_color_params
from pretrain.diagnostics.step_count import measure
from pretrain.engine.trainer import NonFiniteLossError, PretrainTrainer
from pretrain.utils.errors import LoracError
from tests.helpers import ROOT, tiny_opts

DEMO_CONFIG = str(ROOT / "configs" / "pretrain" / "demo_fashion_mnist_r18.yaml")


@pytest.mark.parametrize(
    ("config", "syncs"),
    [
        ("configs/pretrain/demo_fashion_mnist_r18_mocov2.yaml", 0),
        # with the prior on, eigh's error check (the exact nuclear norm): docs/performance.md
        ("configs/pretrain/demo_fashion_mnist_r18.yaml", 1),
    ],
)
def test_no_host_sync_in_a_non_logging_iteration(config, syncs):
    m = measure(config, procs=1)
    assert m["ops"] > 500  # the counter saw the step (forward, backward, optimiser)
    assert m["host_syncs"] == syncs, m["syncs_by_source"]
    assert all(k.startswith("_linalg_eigh") for k in m["syncs_by_source"])


def test_the_counter_sees_a_host_sync_and_moco_m_makes_none(monkeypatch):
    """MoCo-M's step with one ``.item()`` added (by a hook, after the backward) reports exactly
    it: the counter sees a sync, and the step itself makes none."""

    class ReadAGradient(HookBase):
        def after_backward(self):
            next(self.trainer.model.parameters()).grad.sum().item()

    monkeypatch.setattr(PretrainTrainer, "extra_hooks", lambda self: [ReadAGradient()])
    m = measure("configs/pretrain/demo_fashion_mnist_r18_mocom.yaml", procs=1)
    assert m["ops"] > 500
    assert m["host_syncs"] == 1
    assert any("(after_backward)" in where and "test_step_device_work.py" in where
               for where in m["syncs_by_source"]), m["syncs_by_source"]  # fmt: skip


@pytest.mark.parametrize("given", [False, True])
def test_one_pass_colour_augmentation_equals_the_chunked_one(given):
    """One pipeline per resolution (the GPU path) gives the CPU path's values up to float
    rounding (the blur's taps are normalised over a longer, zero-padded kernel there)."""
    g = torch.Generator().manual_seed(0)
    views = [torch.randint(0, 256, (5, 3, s, s), dtype=torch.uint8, generator=g) for s in (24,) * 3]
    views += [torch.randint(0, 256, (5, 3, 12, 12), dtype=torch.uint8, generator=g)]
    spec = ColorSpec().replace(Blur(prob=0.7))
    params = [sample_color_params(5, spec, torch.Generator().manual_seed(i)) for i in range(4)]
    outs = []
    for one_pass in (False, True):
        augment = BatchColorAugment(spec, cpu_chunk_pixels=24 * 24 * 2, one_pass=one_pass)
        kwargs = {"params": params} if given else {}
        outs.append(augment(views, torch.Generator().manual_seed(1), **kwargs))
    for chunked, one in zip(*outs, strict=True):
        torch.testing.assert_close(one, chunked, rtol=0, atol=1e-5)


@pytest.mark.parametrize("static", [False, True])
def test_non_finite_loss_between_logs_is_never_checkpointed(tmp_path, image_folder, static):
    """The losses stay on the device (the static step's in its ring buffer); they are read at
    the next logging or checkpointing iteration, and the error names the first bad iteration
    and the intact checkpoint."""
    out = tmp_path / "run"
    opts = {"SOLVER.MAX_ITER": 12, "SOLVER.LOG_PERIOD": 5, "SOLVER.CHECKPOINT_PERIOD": 4,
            "SOLVER.STATIC_STEP": static}  # fmt: skip
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **opts))
    trainer = PretrainTrainer(cfg)

    class _Poison(HookBase):
        def before_step(self):
            if self.trainer.iter == 5:  # after the checkpoint of iteration 3 and the log of 4
                with torch.no_grad():
                    next(self.trainer.model.encoder_q.parameters()).fill_(float("nan"))

    trainer.register_hooks([_Poison()])
    with pytest.raises(NonFiniteLossError, match="non-finite loss at iteration 5; ") as e:
        trainer.train()
    assert isinstance(e.value, LoracError) and isinstance(e.value, FloatingPointError)
    assert f"the last checkpoint, {out / 'model_0000003.pth'}, is intact" in str(e.value)
    # a lower lr need not start afresh: the message says how to resume with one
    resume = "the same command resumes from it (with --resume-with-changes SOLVER.BASE_LR"
    assert resume in str(e.value)
    assert (out / "last_checkpoint").read_text() == "model_0000003.pth"
    assert not (out / "model_0000007.pth").exists()
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    # no loss of the bad iterations was logged (the timer's and lr's values are)
    assert max(r["iteration"] for r in lines if "total_loss" in r) == 4


def _train_forward(model, b: int) -> torch.Tensor:
    """One training forward of ``model`` on random views of ``b`` images (one process, no
    ShuffleBN groups); returns the keys it must enqueue: (J, b, d), the key encoder's on each key
    crop."""
    views = [torch.randn(b, 3, s, s) for s in model.view_sizes]
    model.train()
    model({"views": views})
    with torch.no_grad():
        return torch.stack([model.encoder_k(views[j]) for j in range(model.num_key_crops)])


def test_queue_pointer_is_restored_from_a_checkpoint(tmp_path, image_folder):
    """The device queue pointer comes back with the checkpoint, and the next keys go where it
    points (wrapping around at the queue's end), every queue at its own pointer."""
    out = tmp_path / "q"
    cfg = load_config(DEMO_CONFIG, tiny_opts(image_folder, out, **{"MODEL.QUEUE_SIZE": 64}))
    trainer = PretrainTrainer(cfg)
    trainer.train()  # 6 iterations of 8: the pointer is at 48
    assert trainer.model.queue_ptr.tolist() == [48]
    fresh = PretrainTrainer(cfg)
    assert fresh.resume()
    model = fresh.model
    assert model.queue_ptr.tolist() == [48]
    before = model.queues.clone()
    for expected_ptr in (56, 0):
        start = model.queue_ptr.tolist()[0]
        keys = _train_forward(model, 8)
        assert model.queue_ptr.tolist() == [expected_ptr]
        torch.testing.assert_close(model.queues[0, start : start + 8], keys[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(model.queues[0, :48], before[0, :48], rtol=0, atol=0)


def test_each_queue_is_written_at_its_own_pointer():
    """Two key crops, pointers apart: one training forward writes each queue's rows at its own
    pointer, and no other row."""
    from pretrain.modeling import build_model

    opts = {"MODEL.QUEUE_SIZE": 16, "SOLVER.IMS_PER_BATCH": 4, "DATASETS.ROOT": "/x",
            "MODEL.DEVICE": "cpu", "INPUT.LARGE_SIZE": 32, "INPUT.SMALL_SIZE": 16,
            "MODEL.CHANNELS_LAST": False}  # fmt: skip
    cfg = load_config(
        str(ROOT / "configs" / "pretrain" / "in100_r18_lorac_beta2.yaml"),
        [str(x) for kv in {**opts, "DATASETS.CLASS_LIST": ""}.items() for x in kv],
    )
    model = build_model(cfg)
    assert model.num_key_crops == 2
    model.queue_ptr.copy_(torch.tensor([4, 12]))
    before = model.queues.clone()
    keys = _train_forward(model, 4)
    torch.testing.assert_close(model.queues[0, 4:8], keys[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(model.queues[1, 12:16], keys[1], rtol=0, atol=1e-6)
    written = (model.queues != before).any(-1)  # (J, K)
    assert written[0].nonzero().flatten().tolist() == [4, 5, 6, 7]
    assert written[1].nonzero().flatten().tolist() == [12, 13, 14, 15]
    assert model.queue_ptr.tolist() == [8, 0]


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


@pytest.mark.processes  # make test-processes
def test_two_processes_keep_one_layout_and_read_back_only_the_norm():
    """A 2-process step of a channels_last LORAC config (IN-100's ResNet-18: the same code as
    IN-1K's, cheaper): every collective's input and output share a memory layout (NCCL copies raw
    bytes: channels_last views gathered into NCHW buffers would be scrambled), and the one host
    sync is the norm's eigh on each rank: the multi-crop step without the prior (MoCo-M) makes
    none."""
    m = measure("configs/pretrain/in100_r18_lorac_beta2.yaml", procs=2)
    assert sum(m["collectives"].values()) > 80  # SyncBN's, ShuffleBN's, DDP's buckets (R18)
    assert any("take_rows" in name for name in m["collectives"])  # ShuffleBN's all-to-all
    assert m["layout_mismatches"] == []
    assert all(k.startswith("_linalg_eigh") for k in m["syncs_by_source"]), m["syncs_by_source"]
    assert m["host_syncs_per_rank"] == [1, 1]
