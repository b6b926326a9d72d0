"""Pretraining on a real SLURM cluster: two nodes (two slurmd on this host), CPU, gloo.

Run with ``make test-slurm`` (it starts and stops the cluster, tests/slurm/cluster.sh); skipped
when no test cluster is reachable. Jobs go through the same library call as
``tools/submit_pretrain.py`` (submitit's SlurmExecutor, one task per process).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

from pretrain.cluster.submit import JobRequest, SubmitError, submit
from tests.helpers import make_image_folder, tiny_opts
from tests.slurm.jobtools import SleepEveryStep, job_field, wait_for_iteration, wait_for_job
from transfer.classification.demo import DEMO_CONFIG

pytestmark = pytest.mark.slurm
MAX_ITER = 10
WORKERS = 1


@pytest.fixture(scope="module")
def data(cluster, tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("slurm") / "data")


def _request(data: Path, out: Path, **kw) -> JobRequest:
    # no periodic checkpoint before the end: a mid-run checkpoint can only come from a signal.
    # A data-loader worker per process, as every shipped config has: SLURM signals every
    # process of the job, the workers included (pretrain/utils/signals.py).
    opts = tiny_opts(data, out, **{"SOLVER.MAX_ITER": MAX_ITER, "SOLVER.CHECKPOINT_PERIOD": 100,
                                   "DATALOADER.NUM_WORKERS": WORKERS})  # fmt: skip
    kw.setdefault("timeout_min", 20)
    return JobRequest(config_file=DEMO_CONFIG, args=opts, nodes=2, gpus_per_node=0,
                      tasks_per_node=1, job_dir=str(out / "submitit"), **kw)  # fmt: skip


def _model(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "model_final.pth", weights_only=True)["model"]


def _assert_same_model(a: Path, b: Path) -> None:
    ma, mb = _model(a), _model(b)
    assert ma.keys() == mb.keys()
    for k in ma:
        assert torch.equal(ma[k], mb[k]), k


def _task_logs(job, kind: str) -> list[str]:
    folder = Path(job.paths.folder)
    return [(folder / f"{job.job_id}_{t}_log.{kind}").read_text() for t in (0, 1)]


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """An uninterrupted 2-node run; the other tests must end with exactly its weights."""
    out = tmp_path_factory.mktemp("slurm") / "reference"
    job = submit(_request(data, out))
    state = wait_for_job(job.job_id, timeout_s=600)
    return job, out, state


def test_two_node_job_runs_to_completion(reference):
    """A 2 nodes x 1 process job trains to the end: one task on each node, one process group."""
    job, out, state = reference
    assert state == "COMPLETED", _task_logs(job, "err")[0][-3000:]
    assert job_field(job.job_id, "NodeList") == "n[1-2]"
    out0, out1 = _task_logs(job, "out")
    assert "node=0(2), global_rank=0(2)" in out0 and "node=1(2), global_rank=1(2)" in out1
    log = (out / "log.txt").read_text()
    assert "Rank of current process: 0. World size: 2" in log
    assert f"iter: {MAX_ITER - 1}" in log
    assert (out / "log.txt.rank1").exists()  # rank 1 logs apart, writes no checkpoint
    assert sorted(p.name for p in out.glob("*.pth")) == ["model_final.pth"]


def test_requeued_job_resumes_from_its_signal_checkpoint_exactly(reference, data, tmp_path):
    """`scontrol requeue` mid-run while the data-loader workers run (SLURM sends SIGTERM to every
    process of the job, workers included): the job saves at the next iteration boundary, exits
    without a traceback, runs again, resumes right after it and ends with the reference's
    weights."""
    out = tmp_path / "requeued"
    job = submit(_request(data, out, extra_hooks=[SleepEveryStep(2.0)]))
    wait_for_iteration(out, job.job_id, 3, timeout_s=300)
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)
    assert wait_for_job(job.job_id, timeout_s=600) == "COMPLETED"
    assert int(job_field(job.job_id, "Restarts")) == 1
    log = (out / "log.txt").read_text()
    (saved, resumed_at), *_ = re.findall(r"model_(\d+)\.pth, continuing at iteration (\d+)", log)
    stop = int(saved)
    assert 3 <= stop < MAX_ITER - 1 and int(resumed_at) == stop + 1
    assert f"SIGTERM: stopping after iteration {stop}" in log
    err0 = _task_logs(job, "err")[0]
    assert f"stopped after iteration {stop} (SIGTERM)" in err0
    assert "Traceback" not in err0 and "is killed by signal" not in err0
    assert (out / f"model_{stop:07d}.pth").exists()  # written by the signal, not the period
    _assert_same_model(reference[1], out)


def test_job_at_its_time_limit_requeues_itself_and_finishes(reference, data, tmp_path):
    """A 3-minute limit with the warning signal (USR2) 90 s before it, on a run that needs
    longer: the job saves, requeues itself, resumes, and ends with the reference's weights."""
    # slurmctld checks limits every 30 s, so the warning comes up to 30 s early: 60-90 s into
    # the job, after start-up and before the end of ten 10-second iterations.
    out = tmp_path / "timelimit"
    req = _request(data, out, timeout_min=3, signal_delay_s=90, extra_hooks=[SleepEveryStep(10.0)])
    job = submit(req)
    assert wait_for_job(job.job_id, timeout_s=900) == "COMPLETED"
    assert int(job_field(job.job_id, "Restarts")) >= 1
    log = (out / "log.txt").read_text()
    assert "SIGUSR2: stopping after iteration" in log
    assert f"requeued SLURM job {job.job_id}" in log
    assert "continuing at iteration" in log
    _assert_same_model(reference[1], out)


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"partition": "no-such-partition"}, "invalid partition specified: no-such-partition"),
        ({"tasks_per_node": 4}, "More processors requested than permitted"),  # 2 CPUs per node
    ],
)
def test_requests_slurm_rejects_are_one_line_errors(cluster, data, tmp_path, change, reason):
    req = _request(data, tmp_path / "x")
    for k, v in change.items():
        setattr(req, k, v)
    # 2 images per process (a one-image BatchNorm batch is refused before sbatch is asked)
    req.args += ["SOLVER.IMS_PER_BATCH", str(2 * req.nodes * req.tasks_per_node)]
    with pytest.raises(SubmitError, match=f"^sbatch rejected the job: .*{reason}") as e:
        submit(req)
    assert "\n" not in str(e.value)
