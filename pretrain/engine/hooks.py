"""Training hooks: the momentum update and beta schedule of momentum-contrast pretraining, and
stopping at an iteration boundary on preemption or time-limit signals, with a checkpoint.

:class:`StopOnSignal`'s handler only records the signal (saving inside it would interrupt a step
or a checkpoint write anywhere); at the next iteration boundary the ranks all-reduce what they
received, so they all stop after the same iteration, rank 0 saves and requeues, and the process
exits (:class:`Preempted`). The signals' meanings are in :mod:`pretrain.utils.signals`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from types import FrameType

import torch
import torch.distributed as dist
from detectron2.engine import HookBase
from detectron2.utils import comm
from detectron2.utils.events import CommonMetricPrinter, get_event_storage
from fvcore.common.param_scheduler import ParamScheduler
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from pretrain.utils.signals import (
    NONE,
    STOP,
    STOP_AND_REQUEUE,
    default_stop_signals,
    requeue_slurm_job,
)

__all__ = [
    "BetaSchedule",
    "MetricPrinter",
    "MomentumUpdate",
    "Preempted",
    "StopOnSignal",
    "unwrap",
]

logger = logging.getLogger(__name__)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel wrapper, or ``model`` itself."""
    return model.module if isinstance(model, DistributedDataParallel) else model


class BetaSchedule(HookBase):
    """Sets the model's beta from a ``ParamScheduler`` before every step, as detectron2's
    ``LRScheduler`` hook does for the learning rate (stateless: a function of the iteration)."""

    def __init__(self, scheduler: ParamScheduler, max_iter: int) -> None:
        self.scheduler, self.max_iter = scheduler, int(max_iter)
        self._last: float | None = None

    def before_step(self) -> None:
        b = self.scheduler(self.trainer.iter / self.max_iter)
        unwrap(self.trainer.model).set_beta(b)
        if b != self._last:
            logger.info(f"iteration {self.trainer.iter}: beta = {b}")
            self._last = b


class MomentumUpdate(HookBase):
    """theta_k <- m theta_k + (1 - m) theta_q after every optimiser step (MoCo: before the next
    forward; identical, and a checkpoint's key encoder then matches its query encoder)."""

    def after_step(self) -> None:
        unwrap(self.trainer.model).momentum_update()


class Preempted(SystemExit):
    """Training stopped at an iteration boundary after a signal, with a checkpoint on disk: a
    ``SystemExit`` (status 0, 130 after Ctrl-C), so that neither detectron2 nor submitit reports
    a failure for a job that is going to run again."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _ignore_child(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD while stopping: a worker that died is noticed when its batch is missing."""


class StopOnSignal(HookBase):
    """At the first iteration boundary after a signal received (by any rank), save
    ``model_<last completed iteration>.pth``, requeue when asked to, and raise :class:`Preempted`.

    Handlers are installed for the duration of ``train()`` only, from the main thread. With
    several processes the ranks agree (one ``all_reduce``) only every ``agree_every``-th
    iteration, so that the others run no collective; a stop then waits at most
    ``agree_every - 1`` iterations. ``each_step`` calls :meth:`at_boundary` in ``before_step``,
    for detectron2's own trainers; ``resume`` says in the last line how the run goes on.
    """

    def __init__(
        self,
        signals: Mapping[int, int] | None = None,
        requeue: Callable[[], None] | None = None,
        agree_every: int = 1,
        each_step: bool = False,
        resume: str = "when restarted with the same command",
    ) -> None:
        self._signals = dict(default_stop_signals() if signals is None else signals)
        self._requeue = requeue or requeue_slurm_job
        self._received = NONE
        self._signal_name = ""
        self._previous: dict[int, object] = {}
        self._agree_every = max(1, int(agree_every))
        self._interrupted = False  # a first SIGINT was received
        self._each_step, self._resume = each_step, resume
        self._pid = os.getpid()

    @property
    def pending(self) -> bool:
        """Whether this process received a stop signal during this ``train()``."""
        return self._received != NONE

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of the training loop: record only (see module docstring).
        if signum == signal.SIGINT and os.getpid() != self._pid:
            # a data worker forked while this handler was installed inherits it: Ctrl-C reaches
            # the whole process group, and the main process stops and shuts the workers down
            return
        if signum == signal.SIGINT:
            if self._interrupted:  # a second Ctrl-C: stop now, without a checkpoint
                signal.signal(signal.SIGINT, signal.default_int_handler)
                raise KeyboardInterrupt
            self._interrupted = True
            print(
                "Ctrl-C: stopping after this iteration with a checkpoint (Ctrl-C again: stop "
                "now, without one)",
                file=sys.stderr,
                flush=True,
            )
        action = self._signals.get(signum, STOP)
        if action > self._received:
            self._received, self._signal_name = action, signal.Signals(signum).name
        if signal.SIGCHLD not in self._previous:
            # torch's SIGCHLD handler raises when a worker died of a signal, wherever the main
            # process is; from now on a dead worker only shows as a batch that cannot be fetched
            self._previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, _ignore_child)

    def before_train(self) -> None:
        self._received, self._signal_name, self._interrupted = NONE, "", False
        self._pid = os.getpid()
        if threading.current_thread() is not threading.main_thread():
            logger.warning("training outside the main thread: no preemption signal handling")
            return
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def before_step(self) -> None:
        if self._each_step:
            self.at_boundary()

    def after_train(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def agreed_pending(self) -> bool:
        """Whether any rank received a stop signal (one ``all_reduce`` with several processes;
        every rank calls it): after ``train()``, whether a signal came during its last iteration
        or ``after_train``."""
        return self._agreed_action() != NONE

    def _agreed_action(self) -> int:
        if comm.get_world_size() == 1:
            return self._received
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([self._received], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def at_boundary(self, fetch_error: Exception | None = None) -> None:
        """Stop here, after iteration ``trainer.iter - 1``, if any rank received a signal; every
        rank calls it once the step's batch is fetched. ``fetch_error`` (why the batch could not
        be fetched) is the stop when a signal is pending, otherwise it is raised.
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
        message += " once requeued" if requeue else f" {self._resume}"
        print(message, file=sys.stderr, flush=True)
        raise Preempted(message, 128 + signal.SIGINT if self._interrupted else 0)


class _AppendSignals(logging.LoggerAdapter):
    """Ends each message with the printer's :meth:`MetricPrinter.signals` (one line stays one)."""

    def process(self, msg: object, kwargs: dict) -> tuple[object, dict]:
        signals = self.extra["printer"].signals()
        return (f"{msg}  {signals}" if signals else msg), kwargs


class MetricPrinter(CommonMetricPrinter):
    """detectron2's console printer, printing each iteration once: after a stop, ``after_train``
    writes the iteration just printed again, and detectron2's ETA (without a "time" history: a
    resumed run stopped within IterationTimer's warm-up) then divides by zero.

    Its line also shows the pretraining signals that are logged (detectron2's shows only keys
    with "loss" in them): the instance-discrimination accuracy (median of the window), the mean
    ||Q||_* while the prior is on (beta finite), and the last kNN top-1 with its iteration.
    """

    def __init__(self, max_iter: int | None = None, window_size: int = 20) -> None:
        super().__init__(max_iter, window_size)
        self._printed: int | None = None
        self.logger = _AppendSignals(self.logger, {"printer": self})

    def signals(self) -> str:
        """``inst_acc: 93.1%  ||Q||_*: 3.214  knn/top1: 45.20% (iter 9889)``, for the keys the
        current event storage holds."""
        storage = get_event_storage()
        histories, latest, parts = storage.histories(), storage.latest(), []

        def median(key: str) -> float:
            return histories[key].median(storage.count_samples(key, self._window_size))

        if "inst_acc" in histories:
            parts.append(f"inst_acc: {100 * median('inst_acc'):.1f}%")
        beta = latest.get("beta", (math.inf, 0))[0]
        if "nuclear_norm" in histories and math.isfinite(beta):
            parts.append(f"||Q||_*: {median('nuclear_norm'):.4g}")
        if "knn/top1" in latest:
            top1, at = latest["knn/top1"]
            parts.append(f"knn/top1: {100 * top1:.2f}% (iter {at})")
        return "  ".join(parts)

    def write(self) -> None:
        iteration = get_event_storage().iter
        if iteration != self._printed:
            self._printed = iteration
            super().write()
