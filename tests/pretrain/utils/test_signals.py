"""The SLURM job id that a requeue names."""

from __future__ import annotations

from pretrain.utils.signals import slurm_job_id


def test_array_job_id_for_requeue():
    assert slurm_job_id({"SLURM_JOB_ID": "17"}) == "17"
    assert slurm_job_id({"SLURM_JOB_ID": "18", "SLURM_ARRAY_JOB_ID": "17",
                         "SLURM_ARRAY_TASK_ID": "1"}) == "17_1"  # fmt: skip
    assert slurm_job_id({}) is None
