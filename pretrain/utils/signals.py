"""The stop signals SLURM sends, what each asks for, requeueing, and data workers that survive them.

* ``SIGTERM``: SLURM is ending the job now (preemption, ``scancel``, the time limit); ``SIGKILL``
  follows ``KillWait`` seconds later. We only save; whether the job runs again is SLURM's call.
* ``SIGUSR1``/``SIGUSR2`` (or submitit's ``SUBMITIT_PREEMPT_SIGNAL``): the warning before the time
  limit (``sbatch --signal=USR2@120``): we save *and* requeue.

The trainer acts on them at an iteration boundary (:class:`pretrain.engine.hooks.StopOnSignal`).
SLURM signals every process of a job step, data-loader workers included: the workers
(:func:`shield_data_worker`) ignore stop signals from anyone but their parent, so that they serve
the main process until it stops; and once a stop is pending, the main process ignores SIGCHLD and
takes a batch that cannot be fetched as the stop. Standard library only: the data loaders import
this module.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Mapping

__all__ = [
    "NONE",
    "STOP",
    "STOP_AND_REQUEUE",
    "default_stop_signals",
    "requeue_slurm_job",
    "shield_data_worker",
    "slurm_job_id",
]

logger = logging.getLogger(__name__)

# What a signal asks for, ordered: the ranks agree on the largest one any of them received.
NONE, STOP, STOP_AND_REQUEUE = 0, 1, 2


def slurm_job_id(environ: Mapping[str, str] | None = None) -> str | None:
    """The id ``scontrol requeue`` needs (``ARRAYID_TASKID`` for array jobs), None outside SLURM."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID")


def requeue_slurm_job() -> None:
    """``scontrol requeue`` this job (SLURM then kills it and starts it again, same id)."""
    job = slurm_job_id()
    if job is None:
        logger.warning("not running under SLURM: nothing to requeue, restart the run to resume")
        return
    proc = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        # the checkpoint is on disk either way; say how to continue by hand
        logger.error(f"scontrol requeue {job} failed ({proc.stderr.strip()}); resubmit to resume")
    else:
        logger.info(f"requeued SLURM job {job}")


def default_stop_signals(interrupt: bool = False) -> dict[int, int]:
    """Signal -> :data:`STOP` or :data:`STOP_AND_REQUEUE` (module docstring); with ``interrupt``
    SIGINT (Ctrl-C) stops too."""
    sigs = {signal.SIGTERM: STOP, signal.SIGUSR1: STOP_AND_REQUEUE}
    if interrupt:
        sigs[signal.SIGINT] = STOP
    sigs[signal.SIGUSR2] = STOP_AND_REQUEUE
    submitit_sig = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)
    if submitit_sig is not None and submitit_sig not in sigs:
        sigs[submitit_sig] = STOP_AND_REQUEUE
    return sigs


def shield_data_worker(worker_id: int) -> None:
    """``worker_init_fn`` of data loaders: survive stop signals meant for the main process.

    The stop signals and SIGINT are taken on a thread with ``sigwaitinfo``, which tells the
    sender: SIGTERM from the parent (its orderly shutdown) exits at once, as torch's handler
    does; the rest is ignored. (``SIG_IGN`` would keep ``multiprocessing`` from stopping them.)
    """
    del worker_id
    if not hasattr(signal, "sigwaitinfo"):  # not on macOS/Windows: keep torch's behaviour
        return
    # SIGINT too: Ctrl-C reaches the whole process group, and the main process decides
    sigs = set(default_stop_signals()) | {signal.SIGINT}
    parent = os.getppid()
    # Block first: threads started later (the waiter included) inherit the mask, and a blocked
    # signal waits for sigwaitinfo instead of running torch's SIGTERM handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, sigs)

    def wait() -> None:
        while True:
            info = signal.sigwaitinfo(sigs)
            if info.si_signo == signal.SIGTERM and info.si_pid == parent:
                os._exit(0)

    threading.Thread(target=wait, name="lorac-worker-signals", daemon=True).start()
