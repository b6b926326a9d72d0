"""Process layout from launcher variables (torchrun, SLURM job steps, submitit's local executor)."""

from __future__ import annotations

import pytest

from pretrain.utils.distributed import (
    DistEnvError,
    dist_env_from_environ,
    expand_nodelist,
    init_distributed,
    job_port,
)

SLURM_STEP = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "1",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
}


def test_torchrun_variables():
    env = dist_env_from_environ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
                                 "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h0",
                                 "MASTER_PORT": "1234", "GROUP_RANK": "1"})  # fmt: skip
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.master_addr, env.master_port, env.node_rank) == ("h0", 1234, 1)
    assert env.source == "torchrun"


def test_slurm_step_variables(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")  # no scontrol: the built-in node list parser
    env = dist_env_from_environ(SLURM_STEP)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (5, 8, 1, 4)
    assert (env.node_rank, env.master_addr, env.source) == (1, "gpu07", "slurm")
    assert env.master_port == job_port("4242")
    # a requeued run (same job id) gets another port: the old sockets may linger in TIME_WAIT
    again = dist_env_from_environ({**SLURM_STEP, "SLURM_RESTART_COUNT": "1"})
    assert again.master_port != env.master_port and 20000 <= again.master_port < 60000


def test_batch_script_without_srun_is_single_process():
    batch = {k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_ID"}
    assert dist_env_from_environ(batch) is None
    assert dist_env_from_environ({}) is None


def test_submitit_local_variables():
    env = dist_env_from_environ({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": "1",
                                 "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NTASKS": "2",
                                 "SUBMITIT_LOCAL_JOB_ID": "777"})  # fmt: skip
    assert (env.rank, env.world_size, env.master_addr, env.master_port) == (
        1, 2, "127.0.0.1", job_port("777"),
    )  # fmt: skip


@pytest.mark.parametrize(
    "nodelist,hosts",
    [
        ("n1", ["n1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[07-09,12],login1", ["gpu07", "gpu08", "gpu09", "gpu12", "login1"]),
        ("a[1,3],b[009-010]", ["a1", "a3", "b009", "b010"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


def test_uneven_tasks_per_node_is_refused():
    env = dist_env_from_environ({**SLURM_STEP, "SLURM_STEP_TASKS_PER_NODE": "3,5",
                                 "MASTER_ADDR": "x"})  # fmt: skip
    with pytest.raises(DistEnvError, match="same number of processes on every node"):
        init_distributed(env, "cpu")
