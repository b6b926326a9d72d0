"""Process layout from launcher variables, and the stop-on-signal hook on a fake trainer."""

from __future__ import annotations

import os
import signal

import pytest

from pretrain.cluster.distributed import (
    DistEnvError,
    dist_env_from_environ,
    expand_nodelist,
    init_distributed,
    job_port,
)
from pretrain.cluster.preemption import Preempted, StopOnSignal, slurm_job_id

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


def test_array_job_id_for_requeue():
    assert slurm_job_id({"SLURM_JOB_ID": "17"}) == "17"
    assert slurm_job_id({"SLURM_JOB_ID": "18", "SLURM_ARRAY_JOB_ID": "17",
                         "SLURM_ARRAY_TASK_ID": "1"}) == "17_1"  # fmt: skip
    assert slurm_job_id({}) is None


class _Checkpointer:
    save_dir = "/out"

    def __init__(self):
        self.saved: list[tuple[str, int]] = []

    def save(self, name: str, iteration: int) -> None:
        self.saved.append((name, iteration))


class _Trainer:
    def __init__(self, max_iter: int):
        self.iter, self.max_iter = 0, max_iter
        self.checkpointer = _Checkpointer()


def _hook(trainer, requeued: list) -> StopOnSignal:
    hook = StopOnSignal(requeue=lambda: requeued.append(True))
    hook.trainer = trainer
    return hook


@pytest.mark.parametrize("sig,requeue", [(signal.SIGTERM, False), (signal.SIGUSR1, True),
                                         (signal.SIGUSR2, True)])  # fmt: skip
def test_signal_stops_at_the_step_boundary_with_a_checkpoint(sig, requeue):
    """The handler only records; the save, the requeue (USR1/USR2 only) and the stop happen at
    the next step boundary (the start of the next step, ``at_boundary``), with the state of the
    last completed iteration; the previous handlers come back after training."""
    trainer, requeued = _Trainer(max_iter=10), []
    trainer.start_iter = 0
    hook = _hook(trainer, requeued)
    before = signal.getsignal(sig)
    hook.before_train()
    try:
        trainer.iter = 4  # the start of iteration 4: no signal yet
        hook.at_boundary()
        assert trainer.checkpointer.saved == []
        os.kill(os.getpid(), sig)  # during iteration 4: delivered before the next bytecode
        assert hook.pending and trainer.checkpointer.saved == []  # nothing happens mid-step
        trainer.iter = 5  # the start of iteration 5
        with pytest.raises(Preempted, match=f"stopped after iteration 4 .{sig.name}."):
            hook.at_boundary()
    finally:
        hook.after_train()
    assert trainer.checkpointer.saved == [("model_0000004", 4)]
    assert trainer.iter == 4  # the state saved and seen by after_train is iteration 4's
    assert requeued == ([True] if requeue else [])
    assert signal.getsignal(sig) is before


def test_signal_during_the_last_iteration_lets_the_run_finish():
    """No step starts after the last iteration, so no boundary stops it: the final checkpoint
    is written as usual (the hook saves nothing itself)."""
    trainer, requeued = _Trainer(max_iter=5), []
    trainer.start_iter = 0
    hook = _hook(trainer, requeued)
    hook.before_train()
    try:
        trainer.iter = 4  # the start of the last iteration
        hook.at_boundary()
        os.kill(os.getpid(), signal.SIGUSR1)  # during it
        assert hook.pending
    finally:
        hook.after_train()
    assert trainer.checkpointer.saved == [] and requeued == []
