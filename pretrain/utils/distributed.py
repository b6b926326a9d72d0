"""torch.distributed from the environment a launcher leaves: torchrun, SLURM's srun, submitit.

One process per task. The layout comes from torchrun's variables, submitit's ``LocalExecutor``
(``SUBMITIT_LOCAL_*``) or a SLURM job step (inside ``srun``; the master is the step's first host,
the port derived from the job id, so every task computes the same one alone).

Failing fast: a dead or hung process must end the job, not leave the others waiting until the
time limit. The group times out after ``DIST.TIMEOUT_MINUTES`` and NCCL runs with asynchronous
error handling (:data:`FAIL_FAST_ENV`), without which its timeout is never enforced.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from pretrain.utils.errors import LoracError

__all__ = [
    "FAIL_FAST_ENV",
    "DistEnv",
    "dist_env_from_environ",
    "expand_nodelist",
    "first_host",
    "init_distributed",
    "job_port",
    "maybe_init_distributed",
    "set_fail_fast_env",
]

# NCCL aborts the process on a failed or timed-out collective (torch's name since 2.2; the older
# NCCL_ASYNC_ERROR_HANDLING is deprecated). Set for every process before the group is created.
FAIL_FAST_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
DEFAULT_TIMEOUT_MIN = 10.0  # as DIST.TIMEOUT_MINUTES' default

logger = logging.getLogger(__name__)


class DistEnvError(LoracError, RuntimeError):
    """The launcher's variables describe a layout this code cannot run."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    node_rank: int
    source: str  # "torchrun", "slurm" or "submitit-local": for logs and error messages


def job_port(job_id: str, restart: int = 0) -> int:
    """A port in [20000, 60000) that every task of a job derives alike; the restart count keeps
    a requeued job off the sockets its previous run left in TIME_WAIT."""
    digits = "".join(c for c in job_id if c.isdigit()) or "0"
    return 20000 + (16 * int(digits) + restart) % 40000


def expand_nodelist(nodelist: str) -> list[str]:
    """``"gpu[01-02,5],login1"`` -> ``["gpu01", "gpu02", "gpu5", "login1"]``, where
    ``scontrol show hostnames`` is missing."""
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?(?:,|$)", nodelist):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            hosts += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi or lo) + 1)]
    if not hosts:
        raise DistEnvError(f"cannot parse SLURM node list {nodelist!r}")
    return hosts


def first_host(nodelist: str) -> str:
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return expand_nodelist(nodelist)[0]


def _tasks_on_node(tasks_per_node: str, node: int) -> int:
    """``SLURM_STEP_TASKS_PER_NODE`` (``"2(x3),1"``) -> the task count of node ``node``."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise DistEnvError(f"cannot parse SLURM tasks per node {tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node]


def dist_env_from_environ(environ: Mapping[str, str] | None = None) -> DistEnv | None:
    """The process layout from torchrun / submitit-local / SLURM-step variables, else None."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, local = int(env["RANK"]), int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"]))
        return DistEnv(
            rank=rank,
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=local,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            node_rank=int(env.get("GROUP_RANK", rank // max(local, 1))),
            source="torchrun",
        )
    if env.get("SUBMITIT_EXECUTOR") == "local" and "SUBMITIT_LOCAL_GLOBALID" in env:
        world = int(env["SUBMITIT_LOCAL_NTASKS"])
        return DistEnv(
            rank=int(env["SUBMITIT_LOCAL_GLOBALID"]),
            world_size=world,
            local_rank=int(env["SUBMITIT_LOCAL_LOCALID"]),
            local_world_size=world,
            master_addr="127.0.0.1",
            master_port=int(env.get("MASTER_PORT") or job_port(env["SUBMITIT_LOCAL_JOB_ID"])),
            node_rank=0,
            source="submitit-local",
        )
    if "SLURM_STEP_ID" in env and "SLURM_PROCID" in env:
        node = int(env.get("SLURM_NODEID", 0))
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "1")
        nodelist = env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"]
        port = env.get("MASTER_PORT") or job_port(
            env["SLURM_JOB_ID"], int(env.get("SLURM_RESTART_COUNT", 0))
        )
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env.get("SLURM_STEP_NUM_TASKS") or env["SLURM_NTASKS"]),
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=_tasks_on_node(per_node, node),
            master_addr=env.get("MASTER_ADDR") or first_host(nodelist),
            master_port=int(port),
            node_rank=node,
            source="slurm",
        )
    return None


def set_fail_fast_env(environ: dict[str, str] | None = None) -> None:
    """Put :data:`FAIL_FAST_ENV` into ``environ`` (``os.environ``) where the user did not set it."""
    env = os.environ if environ is None else environ
    for key, value in FAIL_FAST_ENV.items():
        env.setdefault(key, value)


def init_distributed(env: DistEnv, device: str, timeout_min: float = DEFAULT_TIMEOUT_MIN) -> None:
    """Join the process group (gloo on CPU, NCCL on GPU; collectives time out after
    ``timeout_min``) and create detectron2's per-machine group, so
    ``comm.get_local_rank()``/``comm.get_local_size()`` work as under ``launch``."""
    from detectron2.utils import comm

    # detectron2's local groups are consecutive rank blocks of equal size, one per machine
    if env.rank != env.node_rank * env.local_world_size + env.local_rank or (
        env.world_size % env.local_world_size
    ):
        raise DistEnvError(
            f"{env.source}: rank {env.rank} of {env.world_size} with local rank {env.local_rank} "
            f"of {env.local_world_size}: needs the same number of processes on every node with "
            "consecutive ranks per node (SLURM's default block distribution)"
        )
    if device == "cuda":
        if env.local_rank >= torch.cuda.device_count():
            raise DistEnvError(
                f"local rank {env.local_rank} but only {torch.cuda.device_count()} visible GPUs: "
                "every process must see all of its node's GPUs (SLURM's default with "
                "--gpus-per-node; no per-task GPU binding)"
            )
        torch.cuda.set_device(env.local_rank)
    host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
    logger.info(
        f"joining process group ({env.source}): rank {env.rank} of {env.world_size}, "
        f"master {host}:{env.master_port}"
    )
    set_fail_fast_env()
    dist.init_process_group(
        backend="nccl" if device == "cuda" else "gloo",
        init_method=f"tcp://{host}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(minutes=timeout_min),
    )
    comm.create_local_process_group(env.local_world_size)
    comm.synchronize()


def maybe_init_distributed(
    device: str,
    environ: Mapping[str, str] | None = None,
    timeout_min: float = DEFAULT_TIMEOUT_MIN,
) -> int:
    """Initialise torch.distributed from the launcher's variables unless it already is (e.g. by
    detectron2's ``launch``, which gets the same timeout); returns the world size."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    env = dist_env_from_environ(environ)
    if env is None or env.world_size == 1:
        return 1
    init_distributed(env, device, timeout_min)
    return env.world_size
