"""Stopping at an iteration boundary on preemption or time-limit signals, with a checkpoint.

Signals and what they mean on SLURM:

* ``SIGTERM``: SLURM is ending the job now (preemption with ``PreemptMode=REQUEUE``,
  ``scontrol requeue``, ``scancel``, the time limit itself); it sends ``SIGKILL`` ``KillWait``
  seconds later (30 by default). Whether the job runs again is SLURM's decision: we only save.
* ``SIGUSR1``/``SIGUSR2``: the warning ``sbatch --signal=USR2@120`` sends before the time limit
  (submitit's default signal is USR2, ``SUBMITIT_PREEMPT_SIGNAL`` changes it), or a user's
  ``scancel --signal=USR1``: we save *and* requeue the job, which then resumes from the save.

The handler only records the signal: saving from inside it would interrupt the step (or a
checkpoint write) at an arbitrary point. After every step the ranks all-reduce (MAX) what they
received, so they all stop after the same iteration even if the signal reached them at
different moments; the checkpointer writes on rank 0 only, the others wait for it, and the
requeue (``scontrol requeue``) comes from rank 0 once the checkpoint is on disk.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from detectron2.engine import HookBase
from detectron2.utils import comm

__all__ = ["Preempted", "StopOnSignal", "requeue_slurm_job", "slurm_job_id"]

logger = logging.getLogger(__name__)

NONE, STOP, STOP_AND_REQUEUE = 0, 1, 2


class Preempted(SystemExit):
    """Training stopped at an iteration boundary after a signal, with a checkpoint on disk.

    A ``SystemExit`` so that it ends the process (exit status 1, the message on stderr) without
    detectron2 logging it as a training failure, and without submitit writing a result file for
    a job that is going to run again.
    """


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


class StopOnSignal(HookBase):
    """After the first step that ends with a signal received (by any rank), save
    ``model_<iteration>.pth``, requeue when asked to, and raise :class:`Preempted`.

    Handlers are installed for the duration of ``train()`` only (and only from the main thread,
    where Python delivers signals); the previous ones (submitit's, or the defaults) come back in
    ``after_train``. A signal during the last iteration just lets the run finish.
    """

    def __init__(
        self,
        signals: Mapping[int, int] | None = None,
        requeue: Callable[[], None] | None = None,
    ):
        self._signals = dict(_default_signals() if signals is None else signals)
        self._requeue = requeue or requeue_slurm_job
        self._received = NONE
        self._signal_name = ""
        self._previous: dict[int, object] = {}

    def _on_signal(self, signum: int, frame) -> None:
        # Runs between two bytecodes of the training loop: record only (see module docstring).
        action = self._signals.get(signum, STOP)
        if action > self._received:
            self._received, self._signal_name = action, signal.Signals(signum).name

    def before_train(self) -> None:
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

    def after_step(self) -> None:
        action = self._agreed_action()
        trainer = self.trainer
        if action == NONE or trainer.iter + 1 >= trainer.max_iter:
            return
        it = trainer.iter
        name = f"model_{it:07d}"
        why = self._signal_name or "a signal on another rank"
        logger.warning(f"{why}: stopping after iteration {it}, saving {name}.pth")
        trainer.checkpointer.save(name, iteration=it)  # a no-op on ranks other than 0
        comm.synchronize()  # nobody exits (and nothing requeues) before the file is complete
        requeue = action == STOP_AND_REQUEUE
        if requeue and comm.is_main_process():
            self._requeue()
        where = os.path.join(trainer.checkpointer.save_dir, f"{name}.pth")
        then = "once requeued" if requeue else "when restarted"
        raise Preempted(f"stopped after iteration {it} ({why}); resumes from {where} {then}")
