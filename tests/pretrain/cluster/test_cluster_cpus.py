"""The sbatch CPU request of a pretraining job: the node's cores per GPU when the data workers
are one per core (``DATALOADER.NUM_WORKERS -1``), as a fake ``sinfo`` reports the nodes.

Fixed workers still ask for ``NUM_WORKERS + 1`` (test_cluster_submit.py), and
``--cpus-per-task`` always wins.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pretrain.cluster.submit import (
    DEFAULT_CPUS_PER_GPU,
    JobRequest,
    SubmitError,
    dry_run_text,
    node_cpus_per_task,
)
from tests.helpers import tiny_opts
from transfer.classification.demo import DEMO_CONFIG


def _sinfo(tmp_path: Path, monkeypatch, output: str | None) -> Path:
    """A fake ``sinfo`` printing ``output`` and recording its arguments (``None``: no sinfo)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sinfo_calls"
    if output is not None:
        exe = bin_dir / "sinfo"
        exe.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\ncat <<'EOF'\n{output}\nEOF\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return calls


def _request(tmp_path: Path, workers: int = -1, **kw) -> JobRequest:
    kw.setdefault("gpus_per_node", 8)
    # 2 images per GPU: a BatchNorm batch of one image is refused (check_batchnorm_batch)
    batch = 2 * max(1, kw["gpus_per_node"]) * kw.get("nodes", 1)
    opts = tiny_opts(
        tmp_path / "data",
        tmp_path / "out",
        **{"DATALOADER.NUM_WORKERS": workers, "SOLVER.IMS_PER_BATCH": max(8, batch)},
    )
    if kw["gpus_per_node"]:
        opts += ["MODEL.DEVICE", "cuda"]
    return JobRequest(config_file=DEMO_CONFIG, args=opts, **kw)


def _cpus_line(script: str) -> str:
    return next(line for line in script.splitlines() if "--cpus-per-task" in line)


SINFO = "gpu*|128|gpu:a100:8(S:0-1)\nbig|224|gpu:h100:8,gpu:h100:0\ncpu|64|(null)"


def test_gpu_job_asks_for_the_default_partitions_cores_per_gpu(tmp_path, monkeypatch):
    calls = _sinfo(tmp_path, monkeypatch, SINFO)
    script = dry_run_text(_request(tmp_path))
    assert _cpus_line(script) == "#SBATCH --cpus-per-task=16"  # 128 cores / 8 GPUs
    assert calls.read_text().split() == ["--noheader", "--format", "%P|%c|%G"]


def test_gpu_job_on_a_named_partition(tmp_path, monkeypatch):
    """sinfo is asked about that partition only (here it answers for it)."""
    calls = _sinfo(tmp_path, monkeypatch, "big|224|gpu:h100:8")
    script = dry_run_text(_request(tmp_path, partition="big"))
    assert _cpus_line(script) == "#SBATCH --cpus-per-task=28"
    assert "--partition big" in calls.read_text()


def test_mixed_nodes_give_the_smallest_share(tmp_path, monkeypatch):
    _sinfo(tmp_path, monkeypatch, "gpu*|128|gpu:8\ngpu*|96+|gpu:a100:4,gpu:v100:4\ngpu*|x|gpu:8")
    assert node_cpus_per_task(_request(tmp_path)) == 12  # 96 / 8; the unreadable row is skipped


def test_cpu_job_asks_for_the_cores_per_process(tmp_path, monkeypatch):
    _sinfo(tmp_path, monkeypatch, "cpu*|64|(null)")
    script = dry_run_text(_request(tmp_path, gpus_per_node=0, tasks_per_node=2))
    assert _cpus_line(script) == "#SBATCH --cpus-per-task=32"


@pytest.mark.parametrize("output", [None, "", "gpu*|128|(null)"])
def test_without_an_answer_from_sinfo_the_default(tmp_path, monkeypatch, output):
    """No sinfo, nothing listed, or no GPUs on the nodes: DEFAULT_CPUS_PER_GPU (16)."""
    _sinfo(tmp_path, monkeypatch, output)
    assert DEFAULT_CPUS_PER_GPU == 16
    assert _cpus_line(dry_run_text(_request(tmp_path))) == "#SBATCH --cpus-per-task=16"


def test_cpus_per_task_flag_wins_and_sinfo_is_not_asked(tmp_path, monkeypatch):
    calls = _sinfo(tmp_path, monkeypatch, SINFO)
    script = dry_run_text(_request(tmp_path, cpus_per_task=10))
    assert _cpus_line(script) == "#SBATCH --cpus-per-task=10"
    assert not calls.exists()


def test_fixed_workers_ask_for_one_more_cpu(tmp_path, monkeypatch):
    calls = _sinfo(tmp_path, monkeypatch, SINFO)
    script = dry_run_text(_request(tmp_path, workers=3))
    assert _cpus_line(script) == "#SBATCH --cpus-per-task=4"
    assert not calls.exists()


def test_workers_below_minus_one_are_refused(tmp_path, monkeypatch):
    _sinfo(tmp_path, monkeypatch, None)
    with pytest.raises(SubmitError, match="DATALOADER.NUM_WORKERS = -4: a number >= 0, or -1"):
        dry_run_text(_request(tmp_path, workers=-4))
