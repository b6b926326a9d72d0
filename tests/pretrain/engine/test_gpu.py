"""The CUDA path, run by ``make gpu-check`` on a machine with a GPU (skipped without one).

They check what the CPU tests cannot: that a pretraining run trains on CUDA with the shipped GPU
defaults (bfloat16, channels_last, cudnn.benchmark); that a non-logging step makes no host sync
there, judged by CUDA itself (``torch.cuda.set_sync_debug_mode``), which sees the syncs made
inside ops too; that the synchronised BatchNorm on CUDA equals BatchNorm on the whole
batch without a sync; and, with two GPUs or more, that two NCCL processes train like one.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from detectron2.engine import launch
from torch import nn

from pretrain.config import load_config
from pretrain.diagnostics.cuda_syncs import report as sync_report
from pretrain.diagnostics.step_count import measure as count_step
from pretrain.engine.trainer import PretrainTrainer
from pretrain.modeling.norm import SyncBatchNorm, convert_batchnorm
from tests.helpers import ROOT, make_image_folder, tiny_opts

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CONFIGS = ROOT / "configs" / "pretrain"
IN100 = str(CONFIGS / "in100_r18_lorac_beta2.yaml")
GPU_OPTS = ["SOLVER.AMP.ENABLED", "True", "MODEL.CHANNELS_LAST", "True", "TEST.KNN_PERIOD", "0"]
GPU_OPTS += ["DATASETS.CLASS_LIST", "", "INPUT.LARGE_SIZE", "64", "INPUT.SMALL_SIZE", "32"]


def test_gpu_pretraining_run_trains_with_the_gpu_defaults(tmp_path, image_folder):
    opts = tiny_opts(image_folder, tmp_path / "o", **{"MODEL.DEVICE": "cuda"}) + GPU_OPTS
    trainer = PretrainTrainer(load_config(IN100, opts))
    trainer.train()
    assert next(trainer.model.parameters()).is_cuda
    assert (tmp_path / "o" / "model_final.pth").exists()


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        ("in100_r18_mocom.yaml", []),
        ("in100_r18_mocov2.yaml", []),
        ("in100_r18_mocom.yaml", ["MODEL.KEY_BN_SPLITS", "2"]),  # ShuffleBN's path on 1 GPU
    ],
)
def test_gpu_non_logging_steps_make_no_host_sync(config, extra):
    """CUDA's sync detector reports nothing (a value read, a blocking copy, an op that waits)
    in the non-logging iterations of MoCo-M and MoCo-v2."""
    r = sync_report(f"configs/pretrain/{config}", extra)
    assert r["checked_iterations"] >= 3
    assert r["syncs_per_iteration"] == 0, r["by_source"]


def test_gpu_lorac_step_syncs_only_in_the_nuclear_norm():
    """With the prior on, the one sync left is eigh's error check (docs/performance.md)."""
    r = sync_report("configs/pretrain/in100_r18_lorac_beta2.yaml")
    assert r["checked_iterations"] >= 3
    assert all("pretrain/losses/nuclear.py" in k for k in r["by_source"]), r["by_source"]
    assert r["syncs_per_iteration"] >= 1  # the figure itself: output/gpu_check/sync.json


def test_gpu_step_counter_sees_no_sync_but_the_norm():
    m = count_step("configs/pretrain/in1k_r50_lorac_200ep.yaml", procs=1, device="cuda")
    assert set(m["syncs_by_source"]) <= {k for k in m["syncs_by_source"] if "_linalg_eigh" in k}
    assert m["host_syncs"] <= 1
    m = count_step("configs/pretrain/in1k_r50_mocom_200ep.yaml", procs=1, device="cuda")
    assert m["host_syncs"] == 0, m["syncs_by_source"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_sync_batchnorm_equals_batchnorm(dtype):
    """One NCCL process: the synchronised BatchNorm's plain float32 ops (stats, gather,
    elementwise, backward) against
    nn.BatchNorm2d in float32 on the same (dtype-rounded) channels_last batch, with no sync
    (sync debug mode "error"). Statistics and parameter gradients are float32 sums either way;
    outputs and input gradients carry the dtype's rounding."""
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
        )
    try:
        torch.manual_seed(0)
        ref = nn.BatchNorm2d(16).cuda()
        nn.init.uniform_(ref.weight, 0.5, 1.5)
        nn.init.uniform_(ref.bias, -0.5, 0.5)
        synced = convert_batchnorm(nn.BatchNorm2d(16), SyncBatchNorm).cuda()
        synced.load_state_dict(ref.state_dict())
        x = (torch.randn(8, 16, 10, 12, device="cuda") * 2 + 1).to(dtype)
        x = x.contiguous(memory_format=torch.channels_last)
        upstream = torch.randn(x.shape, device="cuda").to(dtype).float()
        out = {}
        for name, bn, xin in (("ref", ref, x.float()), ("synced", synced, x)):
            xi = xin.detach().clone().requires_grad_(True)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error" if name == "synced" else "default")
            try:
                y = bn(xi)
                (y.float() * upstream).sum().backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
            out[name] = {"y": y.float(), "dx": xi.grad.float(), "dw": bn.weight.grad}
            out[name] |= {"db": bn.bias.grad, "mean": bn.running_mean, "var": bn.running_var}
        rounded = 1e-4 if dtype == torch.float32 else 2e-2  # y, dx: bfloat16 outputs
        for key, want in out["ref"].items():
            tol = rounded if key in ("y", "dx") else 1e-4
            torch.testing.assert_close(out["synced"][key], want, rtol=tol, atol=tol, msg=key)
    finally:
        dist.destroy_process_group()


def _two_gpu_worker(config: str, opts: list[str], out: str) -> None:
    trainer = PretrainTrainer(load_config(config, opts))
    trainer.train()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_train_like_one_gpu_with_two_key_bn_groups(tmp_path):
    """DDP, NCCL, SyncBN, ShuffleBN's all-to-all and the real loader with workers: two
    processes equal one process whose key batch is encoded in two BN groups."""
    data = make_image_folder(tmp_path / "data")
    base = {"MODEL.DEVICE": "cuda", "SOLVER.BASE_LR": 0.3, "SOLVER.WARMUP_EPOCHS": 0.0}
    base |= {"SOLVER.MAX_ITER": 6, "DATALOADER.NUM_WORKERS": 2, "SOLVER.AMP.ENABLED": False}
    two = tmp_path / "two"
    opts2 = tiny_opts(data, two, **base)
    launch(
        _two_gpu_worker, 2, dist_url=f"tcp://127.0.0.1:{_free_port()}",
        args=(IN100, opts2, str(two)),
    )  # fmt: skip
    one = PretrainTrainer(load_config(IN100, tiny_opts(data, tmp_path / "one", **base,
                                                       **{"MODEL.KEY_BN_SPLITS": 2})))  # fmt: skip
    one.train()
    a = torch.load(two / "model_final.pth", weights_only=True)["model"]
    b = one.model.state_dict()
    for k in a:
        if "running_" in k or "num_batches" in k:
            continue
        torch.testing.assert_close(b[k].float(), a[k].float(), rtol=0, atol=5e-4, msg=k)


def test_gpu_throughput_benchmark_runs(tmp_path):
    """The script of ``make gpu-check-throughput``, as a user runs it, at 8 images per GPU."""
    out = tmp_path / "ratio.json"
    args = ["--device", "cuda", "--configs", "configs/pretrain/in1k_r50_lorac_200ep.yaml",
            "--batch", "8", "--plain-batch", "8", "--warmup", "1", "--windows", "1",
            "--iters", "2", "--no-compile", "--json", str(out)]  # fmt: skip
    # with this process's environment: make gpu-check's PYTHONPATH holds the installed wheels
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench_throughput", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and all(row["images_per_second"] > 0 for row in rows)


# -- the static step: what the CPU tests prove, asked of a GPU -----------------------------------
STATIC = ["SOLVER.STATIC_STEP", "True"]


@pytest.mark.parametrize(
    "config", ["in100_r18_lorac_beta2.yaml", "in100_r18_mocom.yaml", "in100_r18_mocov2.yaml"]
)
def test_gpu_static_step_makes_no_host_sync(config):
    """CUDA's sync detector, LORAC's prior on included (Jacobi's nuclear norm)."""
    r = sync_report(f"configs/pretrain/{config}", STATIC)
    assert r["checked_iterations"] >= 3
    assert r["syncs_per_iteration"] == 0, r["syncs"]


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_compiled_step_trains_like_the_eager_one(tmp_path, image_folder, mode):
    """SOLVER.COMPILE with inductor (and CUDA graphs): the first iterations' losses within
    bfloat16's rounding of the eager static step's, finite to the end."""
    losses = {}
    for name, extra in (("eager", []), ("compiled", ["SOLVER.COMPILE.ENABLED", "True",
                                                    "SOLVER.COMPILE.MODE", mode])):  # fmt: skip
        out = tmp_path / name
        opts = tiny_opts(image_folder, out, **{"MODEL.DEVICE": "cuda"}) + GPU_OPTS + STATIC
        trainer = PretrainTrainer(load_config(IN100, opts + extra))
        trainer.train()
        lines = [json.loads(x) for x in (out / "metrics.json").read_text().splitlines()]
        losses[name] = [x["total_loss"] for x in lines if "total_loss" in x]
        del trainer
        torch.compiler.reset()
    assert all(math.isfinite(x) for x in losses["compiled"])
    assert losses["compiled"][:2] == pytest.approx(losses["eager"][:2], rel=2e-2)


def test_gpu_prefetcher_copies_the_next_batch_on_a_side_stream():
    """The batches arrive on the GPU equal to the loader's (a ShufflePlan as a plan), the copy
    of each issued (on the side stream) before the previous one is handed over."""
    from pretrain.data.color import ColorSpec, sample_color_params
    from pretrain.data.prefetch import prefetch_to_device
    from pretrain.utils.shuffle_plan import ShufflePlan, shuffle_plan

    g = torch.Generator().manual_seed(0)

    def view() -> torch.Tensor:
        return torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8, generator=g).pin_memory()

    batches = [
        {"views": [view()], "color_params": [sample_color_params(4, ColorSpec(), g).pin_memory()],
         "shuffle_plans": [shuffle_plan(i, 2, 4, 2, rank=1).pin_memory()],
         "seeds": torch.arange(4)}
        for i in range(3)
    ]  # fmt: skip
    it = iter(prefetch_to_device(batches, "cuda"))
    got = list(it)
    assert len(got) == 3
    for want, have in zip(batches, got, strict=True):
        assert have["views"][0].is_cuda and not have["seeds"].is_cuda
        torch.testing.assert_close(have["views"][0].cpu(), want["views"][0], rtol=0, atol=0)
        for k, t in want["color_params"][0].tensors.items():
            torch.testing.assert_close(have["color_params"][0].tensors[k].cpu(), t)
        (plan,) = have["shuffle_plans"]
        assert isinstance(plan, ShufflePlan) and plan.table.is_cuda
        assert torch.equal(plan.table.cpu(), want["shuffle_plans"][0].table)
    assert it.stream != torch.cuda.current_stream()
