"""Helpers for the cluster tests: reaching the SLURM test cluster, watching jobs, and hooks
that slow a run down or signal one rank.

The tests register this module with ``cloudpickle.register_pickle_by_value``, so the hooks
travel inside the submitted job and this file need not be importable where the job runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from detectron2.engine import HookBase
from detectron2.utils import comm

STATE = Path(os.environ.get("LORAC_SLURM_STATE", "/tmp/lorac-slurm"))


class SleepEveryStep(HookBase):
    """Makes each iteration take ``seconds`` longer, so signals land mid-run."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def after_step(self) -> None:
        time.sleep(self.seconds)


class SignalAt(HookBase):
    """Sends ``sig`` to this process before iteration ``iteration``, on rank ``rank`` only."""

    def __init__(self, iteration: int, rank: int, sig: int):
        self.iteration, self.rank, self.sig = iteration, rank, sig

    def before_step(self) -> None:
        if self.trainer.iter == self.iteration and comm.get_rank() == self.rank:
            os.kill(os.getpid(), self.sig)


def cluster_conf() -> str | None:
    """SLURM_CONF of a reachable test cluster (nodes n1 and n2 up), else None.

    Only an explicit ``SLURM_CONF`` counts (``make test-slurm`` exports the one
    ``tests/slurm/cluster.sh`` wrote), so ``make test`` never submits to a cluster it was not
    meant to use.
    """
    conf = os.environ.get("SLURM_CONF")
    if not conf or not os.path.isfile(conf):
        return None
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    usable = {"idle", "mix", "alloc"}
    return conf if states.get("n1") in usable and states.get("n2") in usable else None


def job_field(job_id: str, name: str) -> str:
    """One field of ``scontrol show job`` (works without accounting until MinJobAge)."""
    out = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True
    ).stdout
    for token in out.split():
        key, _, value = token.partition("=")
        if key == name:
            return value
    raise KeyError(f"{name} not in scontrol output for job {job_id}: {out}")


def wait_for_job(job_id: str, timeout_s: float, release_holds: bool = True) -> str:
    """Wait until the job ends; returns its final state. ``release_holds``: a requeued job waits
    (Reason=BeginTime, about two minutes) before it may run again; the tests start it at once."""
    end = time.time() + timeout_s
    while time.time() < end:
        state, reason = job_field(job_id, "JobState"), job_field(job_id, "Reason")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        if release_holds and state == "PENDING" and reason == "BeginTime":
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
        time.sleep(1)
    subprocess.run(["scancel", job_id])
    raise TimeoutError(f"job {job_id} still {state} after {timeout_s} s (cancelled)")


def logged_iterations(out: Path) -> list[int]:
    """Iterations rank 0 wrote to metrics.json so far."""
    path = out / "metrics.json"
    if not path.exists():
        return []
    its = []
    for line in path.read_text().splitlines():
        try:
            its.append(json.loads(line)["iteration"])
        except (ValueError, KeyError):
            continue  # a line being written
    return its


def wait_for_iteration(out: Path, job_id: str, iteration: int, timeout_s: float) -> None:
    end = time.time() + timeout_s
    while time.time() < end:
        if any(i >= iteration for i in logged_iterations(out)):
            return
        if job_field(job_id, "JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
            raise RuntimeError(f"job {job_id} ended before iteration {iteration}")
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} did not reach iteration {iteration} in {timeout_s} s")
