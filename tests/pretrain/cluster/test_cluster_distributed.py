"""Multi-process pretraining on CPU (gloo), without SLURM: torchrun and submitit's local executor.

Two processes with a global batch of 8 must train like one process with the same batch whose
key batch is encoded in two BN groups (MODEL.KEY_BN_SPLITS 2): that exercises ShuffleBN across
processes, the synchronised BN of the query encoder (NaiveSyncBN on CPU), key gathering and the
queues, and DDP's gradient averaging.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch

from pretrain.cluster.submit import JobRequest, submit
from pretrain.config import load_config
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, make_image_folder, tiny_opts
from tests.slurm import jobtools
from tests.slurm.jobtools import SignalAt
from transfer.classification.demo import DEMO_CONFIG

# INPUT.COLOR_ON_DEVICE stays at its default (True): colour parameters are drawn per sample in
# the data workers, so they do not depend on the number of processes.
# BASE_LR 0.3 instead of the demo's 4.0: LARS at that rate amplifies float rounding differences
# between summation orders (one process vs two) beyond a meaningful tolerance within 6 steps.
BASE = {"SOLVER.BASE_LR": 0.3, "SOLVER.WARMUP_EPOCHS": 0.0, "SOLVER.MAX_ITER": 6,
        "SOLVER.CHECKPOINT_PERIOD": 100}  # fmt: skip
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("dist") / "data")


@pytest.fixture(scope="module")
def torchrun_run(data, tmp_path_factory) -> Path:
    """tools/train_pretrain.py under torchrun: 2 processes joining from RANK/WORLD_SIZE/..."""
    out = tmp_path_factory.mktemp("dist") / "torchrun"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tools" / "train_pretrain.py"), "--config-file", DEMO_CONFIG,
           *tiny_opts(data, out, **BASE)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # quiet: no warning from the project's own calls (DDP's arguments), no loader-worker warning
    assert "FutureWarning" not in proc.stderr and "worker processes" not in proc.stderr, proc.stderr
    return out


def _train(opts: list[str]) -> PretrainTrainer:
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, opts))
    trainer.resume()
    trainer.train()
    return trainer


def _losses(out: Path) -> list[float]:
    lines = (out / "metrics.json").read_text().splitlines()
    return [m["total_loss"] for m in map(json.loads, lines) if "total_loss" in m]


def _model(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model_final.pth", weights_only=True)["model"]


def _trained_state(model: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # BN running statistics are left out: they do not enter training-mode forwards, the key
    # encoder's are per process by design (each process sees its own BN group), and
    # NaiveSyncBN keeps the biased variance where torch's BN keeps the unbiased one.
    return {k: v for k, v in model.items() if "running_" not in k and "num_batches" not in k}


@pytest.mark.processes  # make test-processes
def test_two_processes_equal_one_process_with_matching_key_bn_groups(torchrun_run, data, tmp_path):
    log = (torchrun_run / "log.txt").read_text()
    assert "Rank of current process: 0. World size: 2" in log
    two = _losses(torchrun_run)
    one = _train(tiny_opts(data, tmp_path / "one", **BASE, **{"MODEL.KEY_BN_SPLITS": 2}))
    assert len(two) == BASE["SOLVER.MAX_ITER"]
    assert _losses(tmp_path / "one") == pytest.approx(two, rel=1e-4)
    a, b = _trained_state(_model(torchrun_run)), _trained_state(one.model.state_dict())
    assert a.keys() == b.keys() and "queues" in a
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=2e-4, msg=k)
    # the comparison is sensitive: one process with one key BN group (not 2 x 1) differs
    other = tmp_path / "one_group"
    _train(tiny_opts(data, other, **BASE, **{"MODEL.KEY_BN_SPLITS": 1}))
    assert _losses(other) != pytest.approx(two, rel=1e-3)


@pytest.mark.processes  # make test-processes
def test_batchwise_prior_two_processes_equal_one_process(data, tmp_path):
    """LORAC-bs under DDP: P (Eq. 15) spans both processes' instances, gathered with gradients
    (the gather's backward runs an all_reduce inside DDP's backward), so 2 processes train
    exactly like 1 process with the whole batch."""
    opts = {**BASE, "LOSS.PRIOR": "batchwise", "SOLVER.MAX_ITER": 4}
    out = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tools" / "train_pretrain.py"), "--config-file", DEMO_CONFIG,
           *tiny_opts(data, out, **opts)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = _train(tiny_opts(data, tmp_path / "one", **opts, **{"MODEL.KEY_BN_SPLITS": 2}))
    assert _losses(tmp_path / "one") == pytest.approx(_losses(out), rel=1e-4)
    a, b = _trained_state(_model(out)), _trained_state(one.model.state_dict())
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=2e-4, msg=k)


@pytest.mark.processes  # make test-processes
def test_signal_on_one_rank_stops_both_and_the_job_resumes(
    torchrun_run, data, tmp_path, monkeypatch
):
    """submitit LocalExecutor, 2 tasks. SIGUSR1 reaches rank 1 only, before iteration 3 (before
    its batch is fetched: the boundary): both ranks stop after iteration 2 (the all-reduced
    flag), rank 0 alone saves and requeues. The resubmitted job resumes at iteration 3 and ends
    where the uninterrupted torchrun run did."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {fake}/calls\n')
    (fake / "scontrol").chmod(0o755)
    for k, v in {**ENV, "PATH": f"{fake}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242"}.items():
        monkeypatch.setenv(k, v)  # the local tasks inherit this environment
    cloudpickle.register_pickle_by_value(jobtools)
    out = tmp_path / "local"
    req = JobRequest(config_file=DEMO_CONFIG, args=tiny_opts(data, out, **BASE), gpus_per_node=0,
                     tasks_per_node=2, job_dir=str(tmp_path / "submitit"),
                     extra_hooks=[SignalAt(3, rank=1, sig=signal.SIGUSR1)])  # fmt: skip
    job = submit(req, local=True)
    with pytest.raises(Exception, match="stopped after iteration 2"):
        job.result()  # the tasks exit with Preempted: no result, as for submitit's own requeues
    assert (out / "last_checkpoint").read_text() == "model_0000002.pth"
    assert "SIGUSR1: stopping after iteration 2" in (out / "log.txt.rank1").read_text()
    assert "a signal on another rank: stopping after iteration 2" in (out / "log.txt").read_text()
    assert (fake / "calls").read_text() == "requeue 4242\n"  # once, from rank 0

    req.extra_hooks = []
    final = submit(req, local=True).results()[0]  # rank 0's return value
    assert final == str(out / "model_final.pth")
    assert "continuing at iteration 3" in (out / "log.txt").read_text()
    a, b = _trained_state(_model(torchrun_run)), _trained_state(_model(out))
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
