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

from benchmarks.bench_step import StepCounter, measure
from pretrain.config import load_config
from pretrain.data.color import BatchColorAugment, Blur, ColorSpec, sample_color_params
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, tiny_opts

DEMO_CONFIG = str(ROOT / "configs" / "pretrain" / "demo_fashion_mnist_r18.yaml")


@pytest.mark.parametrize(
    ("config", "syncs"),
    [
        ("configs/pretrain/demo_fashion_mnist_r18_mocom.yaml", 0),
        ("configs/pretrain/demo_fashion_mnist_r18_mocov2.yaml", 0),
        # with the prior on, eigh's error check (the exact nuclear norm): docs/performance.md
        ("configs/pretrain/demo_fashion_mnist_r18.yaml", 1),
        ("configs/pretrain/in100_r18_lorac_beta2.yaml", 1),
    ],
)
def test_no_host_sync_in_a_non_logging_iteration(config, syncs):
    m = measure(config, procs=1)
    assert m["ops"] > 500  # the counter saw the step (forward, backward, optimiser)
    assert m["host_syncs"] == syncs, m["syncs_by_source"]
    assert all(k.startswith("_linalg_eigh") for k in m["syncs_by_source"])


def test_the_counter_sees_a_host_sync():
    """The same measurement with one ``.item()`` added to the step reports exactly it."""

    original = PretrainTrainer._backward_and_step

    def with_a_read(self, total):
        original(self, total)
        total.item()

    PretrainTrainer._backward_and_step = with_a_read
    try:
        m = measure("configs/pretrain/demo_fashion_mnist_r18_mocom.yaml", procs=1)
    finally:
        PretrainTrainer._backward_and_step = original
    assert m["host_syncs"] == 1
    assert any("with_a_read" in where for where in m["syncs_by_source"])


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
    with pytest.raises(FloatingPointError, match="non-finite loss at iteration 5"):
        trainer.train()
    assert (out / "last_checkpoint").read_text() == "model_0000003.pth"
    assert not (out / "model_0000007.pth").exists()
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    # no loss of the bad iterations was logged (the timer's and lr's values are)
    assert max(r["iteration"] for r in lines if "total_loss" in r) == 4


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
    keys = torch.randn(1, 8, model.queues.shape[-1])
    for expected_ptr in (56, 0):
        start = model.queue_ptr.tolist()[0]
        model._enqueue(keys)
        assert model.queue_ptr.tolist() == [expected_ptr]
        torch.testing.assert_close(model.queues[0, start : start + 8], keys[0], rtol=0, atol=0)
    torch.testing.assert_close(model.queues[0, :48], before[0, :48], rtol=0, atol=0)


def test_each_queue_is_written_at_its_own_pointer():
    """Two key crops, pointers apart: one index_copy_ writes each queue's rows."""
    from pretrain.modeling import build_model

    opts = {"MODEL.QUEUE_SIZE": 16, "SOLVER.IMS_PER_BATCH": 4, "DATASETS.ROOT": "/x",
            "MODEL.DEVICE": "cpu"}  # fmt: skip
    cfg = load_config(
        str(ROOT / "configs" / "pretrain" / "in100_r18_lorac_beta2.yaml"),
        [str(x) for kv in {**opts, "DATASETS.CLASS_LIST": ""}.items() for x in kv],
    )
    model = build_model(cfg)
    model.queue_ptr.copy_(torch.tensor([4, 12]))
    keys = torch.randn(2, 4, model.queues.shape[-1])
    model._enqueue(keys)
    torch.testing.assert_close(model.queues[0, 4:8], keys[0], rtol=0, atol=0)
    torch.testing.assert_close(model.queues[1, 12:16], keys[1], rtol=0, atol=0)
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


def test_two_process_collectives_keep_one_layout_and_read_nothing_back():
    """A 2-process step of the channels_last IN-1K LORAC config: every collective's input and
    output share a memory layout (on 73e3df2 ShuffleBN gathered channels_last views into NCHW
    buffers, which NCCL would scramble), and the one host sync is the norm's eigh."""
    m = measure("configs/pretrain/in1k_r50_lorac_200ep.yaml", procs=2)
    assert sum(m["collectives"].values()) > 200  # SyncBN's, ShuffleBN's, DDP's buckets
    assert any("take_rows" in name for name in m["collectives"])  # ShuffleBN's all-to-all
    assert m["layout_mismatches"] == []
    assert list(m["syncs_by_source"]) == [
        k for k in m["syncs_by_source"] if k.startswith("_linalg_eigh")
    ]
    assert m["host_syncs"] == 1


def test_baselines_make_no_host_sync_with_two_processes():
    """MoCo-M's multi-crop step (the IN-100 ResNet-18: the same code as IN-1K's, cheaper)."""
    m = measure("configs/pretrain/in100_r18_mocom.yaml", procs=2)
    assert m["host_syncs"] == 0, m["syncs_by_source"]
    assert m["layout_mismatches"] == []


def _count(fn, *device_tensors):
    counter = StepCounter()
    counter.mark(list(device_tensors))
    with counter:
        fn()
    return counter


@pytest.mark.parametrize(
    ("name", "fn", "syncs"),
    [
        ("eigh's error check", lambda x, i: torch.linalg.eigh(x[0] @ x[0].T), 1),
        ("eigvalsh's error check", lambda x, i: torch.linalg.eigvalsh(x[0] @ x[0].T), 1),
        ("svdvals' error check", lambda x, i: torch.linalg.svdvals(x[0]), 1),
        (
            "cholesky_ex checked",
            lambda x, i: torch.linalg.cholesky_ex(x[0] @ x[0].T, check_errors=True),
            1,
        ),  # noqa: E501
        ("cholesky_ex unchecked", lambda x, i: torch.linalg.cholesky_ex(x[0] @ x[0].T), 0),
        ("a Python list as index", lambda x, i: x[[0, 2]], 1),
        ("a boolean mask", lambda x, i: x[x[:, 0, 0] > 0], 1),
        ("a device index", lambda x, i: x[i], 0),
        ("index_select with a device index", lambda x, i: x.index_select(0, i), 0),
        ("a slice", lambda x, i: x[1:3] * 2, 0),
        ("a blocking copy to the device", lambda x, i: torch.arange(4).to(x.device), 1),
        ("a non-blocking copy", lambda x, i: torch.arange(4).to(x.device, non_blocking=True), 0),
        ("a scalar copy", lambda x, i: torch.tensor(3.0).to(x.device), 1),
        ("item assignment", lambda x, i: x[0, 0, 0].__setitem__((), 5.0), 1),
        ("fill_", lambda x, i: x[0, 0, 0].fill_(5.0), 0),
        ("tensor(data, device=)", lambda x, i: torch.tensor([1.0, 2.0], device=x.device), 1),
        ("tolist", lambda x, i: x[0, 0].tolist(), 1),
        (".item()", lambda x, i: x[0, 0, 0].item(), 1),
    ],
)
def test_the_counter_sees_the_syncs_a_gpu_makes_inside_ops(name, fn, syncs):
    """Syncs Python never asks for: linalg error checks, host index tensors, boolean masks,
    blocking host-to-device copies; and none where the GPU makes none."""
    x = torch.randn(4, 3, 3)
    index = torch.tensor([0, 2])
    counter = _count(lambda: fn(x, index), x, index)
    assert sum(counter.syncs.values()) == syncs, (name, dict(counter.syncs))


def test_the_counter_flags_a_collective_with_mixed_layouts(tmp_path):
    """One gloo process: all_gather of a channels_last tensor into NCHW buffers is reported,
    the same gather into buffers of its own layout is not."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        x = torch.randn(2, 3, 4, 4).contiguous(memory_format=torch.channels_last)
        mixed = _count(lambda: dist.all_gather([torch.empty(2, 3, 4, 4)], x))
        same = _count(lambda: dist.all_gather([torch.empty_like(x)], x))
    finally:
        dist.destroy_process_group()
    assert len(mixed.layout_mismatches) == 1 and "channels_last" in mixed.layout_mismatches[0]
    assert same.layout_mismatches == []
    assert same.collective_bytes == same.collective_bytes_received == x.numel() * 4


def test_cuda_sync_report_charges_a_sync_to_the_project_line_that_asked_for_it():
    """A sync reported in torch's own Python (as ``torch.cuda.synchronize``'s is) is charged to
    the innermost frame of this project, with its thread and stack (benchmarks/cuda_sync_report:
    CUDA's detector itself needs a GPU; this is its bookkeeping)."""
    from types import SimpleNamespace

    from benchmarks.cuda_sync_report import SyncDebug

    hook = SyncDebug()
    hook.trainer = SimpleNamespace(iter=3)

    def a_step_that_syncs():
        hook._keep(
            UserWarning("called a synchronizing CUDA operation"), UserWarning,
            "/x/site-packages/torch/cuda/__init__.py", 1281,
        )  # fmt: skip

    a_step_that_syncs()
    hook._keep(UserWarning("an unrelated warning"), UserWarning, "f.py", 1)
    assert len(hook.syncs) == 1
    sync = hook.syncs[0]
    assert sync["origin"] == "torch/cuda/__init__.py:1281"
    assert sync["where"].startswith("tests/pretrain/engine/test_step_device_work.py:")
    assert sync["where"].endswith("(a_step_that_syncs)")
    assert sync["iteration"] == 3 and sync["thread"] == "MainThread"
