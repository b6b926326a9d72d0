"""Stopping at an iteration boundary on preemption or time-limit signals, with a checkpoint.

Signals and what they mean on SLURM:

* ``SIGTERM``: SLURM is ending the job now (preemption with ``PreemptMode=REQUEUE``,
  ``scontrol requeue``, ``scancel``, the time limit itself); it sends ``SIGKILL`` ``KillWait``
  seconds later (30 by default). Whether the job runs again is SLURM's decision: we only save.
* ``SIGUSR1``/``SIGUSR2``: the warning ``sbatch --signal=USR2@120`` sends before the time limit
  (submitit's default signal is USR2, ``SUBMITIT_PREEMPT_SIGNAL`` changes it), or a user's
  ``scancel --signal=USR1``: we save *and* requeue the job, which then resumes from the save.

The handler only records the signal: saving from inside it would interrupt the step (or a
checkpoint write) at an arbitrary point. The trainer calls :meth:`StopOnSignal.at_boundary` at
the start of every step, once the step's batch is fetched and before anything changes: the ranks
all-reduce (MAX) what they received, so they all stop after the same iteration even if the
signal reached them at different moments; the checkpointer writes on rank 0 only, the others
wait for it, and the requeue (``scontrol requeue``) comes from rank 0 once the checkpoint is on
disk. The process then exits with status 0 (:class:`Preempted`).

SLURM signals *every* process of a job step (preemption, ``scancel``, requeue), data-loader
workers included, so the design has to survive the whole process group being signalled:

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
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from types import FrameType

import torch
import torch.distributed as dist
from detectron2.engine import HookBase
from detectron2.utils import comm

__all__ = ["Preempted", "StopOnSignal", "requeue_slurm_job", "shield_data_worker", "slurm_job_id"]

logger = logging.getLogger(__name__)

NONE, STOP, STOP_AND_REQUEUE = 0, 1, 2


class Preempted(SystemExit):
    """Training stopped at an iteration boundary after a signal, with a checkpoint on disk.

    A ``SystemExit`` with status 0: the process ends without detectron2 logging a training
    failure, without a traceback, and without submitit writing a result file for a job that is
    going to run again (SLURM's requeue decides whether it does; exit statuses do not matter to
    it). ``str()`` gives the message, which :class:`StopOnSignal` also writes to stderr.
    """

    def __init__(self, message: str) -> None:
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


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


def _default_signals() -> dict[int, int]:
    sigs = {signal.SIGTERM: STOP, signal.SIGUSR1: STOP_AND_REQUEUE}
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
    sigs = set(_default_signals()) | {signal.SIGINT}
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


def _ignore_child(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD while stopping: a worker that died is noticed when its batch is missing."""


class StopOnSignal(HookBase):
    """At the first iteration boundary after a signal received (by any rank), save
    ``model_<last completed iteration>.pth``, requeue when asked to, and raise
    :class:`Preempted`.

    Handlers are installed for the duration of ``train()`` only (and only from the main thread,
    where Python delivers signals); the previous ones (submitit's, or the defaults) come back in
    ``after_train``, SIGCHLD's included (the trainer shuts its data-loader workers down first).
    A signal during the last iteration just lets the run finish.

    With several processes the ranks agree (one ``all_reduce``) only at the boundaries after
    every ``agree_every``-th iteration (the trainer passes its logging period), so that other
    iterations run no collective and no host sync of their own; a stop then waits for the next
    agreement, at most ``agree_every - 1`` iterations (seconds on a GPU, within SLURM's warning
    time). One process checks at every boundary.
    """

    def __init__(
        self,
        signals: Mapping[int, int] | None = None,
        requeue: Callable[[], None] | None = None,
        agree_every: int = 1,
    ) -> None:
        self._signals = dict(_default_signals() if signals is None else signals)
        self._requeue = requeue or requeue_slurm_job
        self._received = NONE
        self._signal_name = ""
        self._previous: dict[int, object] = {}
        self._agree_every = max(1, int(agree_every))

    @property
    def pending(self) -> bool:
        """Whether this process received a stop signal during this ``train()``."""
        return self._received != NONE

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of the training loop: record only (see module docstring).
        action = self._signals.get(signum, STOP)
        if action > self._received:
            self._received, self._signal_name = action, signal.Signals(signum).name
        if signal.SIGCHLD not in self._previous:
            # torch's SIGCHLD handler raises when a worker died of a signal, wherever the main
            # process is; from now on a dead worker only shows as a batch that cannot be fetched
            self._previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, _ignore_child)

    def before_train(self) -> None:
        self._received, self._signal_name = NONE, ""
        if threading.current_thread() is not threading.main_thread():
            logger.warning("training outside the main thread: no preemption signal handling")
            return
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def after_train(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _agreed_action(self) -> int:
        if comm.get_world_size() == 1:
            return self._received
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([self._received], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def at_boundary(self, fetch_error: Exception | None = None) -> None:
        """Stop here, after iteration ``trainer.iter - 1``, if any rank received a signal.

        The trainer calls this on every rank at the start of each step, once the step's batch is
        fetched and before anything changes. ``fetch_error``: why the batch could not be
        fetched; with a stop signal pending (a worker killed by it) that is the stop, otherwise
        it is raised.
        """
        if fetch_error is not None and not self.pending:
            raise fetch_error
        if comm.get_world_size() > 1 and self.trainer.iter % self._agree_every:
            if fetch_error is not None:
                # Only SIGKILL ends a shielded worker; the other ranks are not at an agreement
                # boundary, so this rank cannot stop them in step: it ends the job instead.
                raise RuntimeError(
                    f"the batch of iteration {self.trainer.iter} could not be fetched after "
                    f"{self._signal_name or 'a signal'}, between two agreement boundaries; "
                    "stopping without a checkpoint (the run resumes from its last one)"
                ) from fetch_error
            return  # not an agreement boundary: no collective here
        action = self._agreed_action()
        if action == NONE:
            return
        trainer = self.trainer
        why = self._signal_name or "a signal on another rank"
        if fetch_error is not None:
            logger.warning(
                f"{why}: the batch of iteration {trainer.iter} could not be fetched "
                f"({type(fetch_error).__name__}: {fetch_error}); stopping before it"
            )
        last = trainer.iter - 1
        trainer.iter = last  # the state saved (and the one after_train sees) is that of `last`
        if last < trainer.start_iter:
            where = "its last checkpoint" if last >= 0 else "the start"
            logger.warning(f"{why}: stopping before any iteration of this run")
            message = f"stopped before iteration {last + 1} ({why}); resumes from {where}"
        else:
            name = f"model_{last:07d}"
            logger.warning(f"{why}: stopping after iteration {last}, saving {name}.pth")
            flush = getattr(trainer, "flush_metrics", None)  # every rank: it may gather
            if flush is not None:
                flush()
            trainer.checkpointer.save(name, iteration=last)  # a no-op on ranks other than 0
            where = os.path.join(trainer.checkpointer.save_dir, f"{name}.pth")
            message = f"stopped after iteration {last} ({why}); resumes from {where}"
        comm.synchronize()  # nobody exits (and nothing requeues) before the file is complete
        requeue = action == STOP_AND_REQUEUE
        if requeue and comm.is_main_process():
            self._requeue()
        message += " once requeued" if requeue else " when restarted"
        print(message, file=sys.stderr, flush=True)
        raise Preempted(message)
