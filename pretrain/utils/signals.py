"""The stop signals SLURM sends, what each asks for, requeueing, and data workers that survive them.

Signals and what they mean on SLURM:

* ``SIGTERM``: SLURM is ending the job now (preemption with ``PreemptMode=REQUEUE``,
  ``scontrol requeue``, ``scancel``, the time limit itself); it sends ``SIGKILL`` ``KillWait``
  seconds later (30 by default). Whether the job runs again is SLURM's decision: we only save.
* ``SIGUSR1``/``SIGUSR2``: the warning ``sbatch --signal=USR2@120`` sends before the time limit
  (submitit's default signal is USR2, ``SUBMITIT_PREEMPT_SIGNAL`` changes it), or a user's
  ``scancel --signal=USR1``: we save *and* requeue the job, which then resumes from the save.

The trainer acts on them at an iteration boundary (:class:`pretrain.engine.hooks.StopOnSignal`,
which says how). SLURM signals *every* process of a job step (preemption, ``scancel``, requeue),
data-loader workers included, so the design has to survive the whole process group being
signalled:

* Data-loader workers (:func:`shield_data_worker`, their ``worker_init_fn``) take the stop
  signals on a thread with ``sigwaitinfo``: a SIGTERM from their parent (the orderly shutdown,
  ``multiprocessing``'s ``terminate()``) ends them at once, as torch's own worker handler does;
  any other sender's is ignored, so the workers keep serving the main process until it stops at
  the iteration boundary and shuts them down itself (the trainer does, before restoring the
  signal handlers). Plain ``SIG_IGN`` would not do: ``multiprocessing`` could then not stop its
  daemon children and every process would hang at exit.
* A worker can still die of the signal (one killed before it installed the filter, or by another
  process's hand). On the first stop signal the main process therefore stops listening to
  SIGCHLD (torch's handler would raise "DataLoader worker ... is killed by signal" at any
  bytecode, e.g. in the middle of the checkpoint write), and a batch that cannot be fetched
  while a stop is pending is not an error: it is the stop, after the last completed iteration.

Standard library only: data loaders (below the engine) import :func:`shield_data_worker`.
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
    """Signal -> :data:`STOP` or :data:`STOP_AND_REQUEUE`: SIGTERM stops, SIGUSR1, SIGUSR2 and
    submitit's ``SUBMITIT_PREEMPT_SIGNAL`` stop and requeue; with ``interrupt`` SIGINT (Ctrl-C)
    stops too (what ``tools/train_pretrain.py`` asks for; a tool that handles Ctrl-C itself,
    such as the study, leaves it out)."""
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

    Blocks the stop signals (SIGTERM, SIGUSR1, SIGUSR2, submitit's) and SIGINT in this worker
    and takes them on a daemon thread with ``sigwaitinfo``, which tells the sender: SIGTERM from
    the parent process (the data loader's or ``multiprocessing``'s shutdown) exits at once with
    status 0, like torch's own worker handler; everything else is ignored (the main process stops
    at an iteration boundary and then shuts the workers down). SIGKILL still ends a worker, and a
    worker whose parent died exits on its own (torch's watchdog).
    """
    del worker_id
    if not hasattr(signal, "sigwaitinfo"):  # not on macOS/Windows: keep torch's behaviour
        return
    # SIGINT too: Ctrl-C reaches the whole process group, and the main process decides (the
    # study's workers turn it into a checkpoint; a plain run stops and shuts the workers down)
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
