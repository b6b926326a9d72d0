"""The stop-on-signal hook on a fake trainer: the signal is recorded, the stop happens at the
next step boundary; the console printer survives the stop's second write of one iteration and
shows the pretraining signals."""

from __future__ import annotations

import logging
import math
import os
import signal

import pytest
from detectron2.utils.events import CommonMetricPrinter, EventStorage

from pretrain.engine.hooks import MetricPrinter, Preempted, StopOnSignal


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


@pytest.mark.parametrize("printer", [CommonMetricPrinter, MetricPrinter])
def test_a_resumed_run_stopped_in_the_timer_warm_up_prints_each_iteration_once(
    printer, monkeypatch
):
    """Resumed at iteration 5, stopped after 6: no "time" history yet (IterationTimer's warm-up
    is 3 iterations), and ``after_train`` writes iteration 6 again. detectron2's printer divides
    by zero there (the linear probe's Ctrl-C exit became a traceback)."""
    printed = []
    write = CommonMetricPrinter.write
    monkeypatch.setattr(CommonMetricPrinter, "write", lambda self: [printed.append(1), write(self)])
    writer = printer(max_iter=100)
    with EventStorage(start_iter=5) as storage:
        for it in (5, 6):
            storage.iter = it
            storage.put_scalar("total_loss", 1.0)
            writer.write()
        if printer is CommonMetricPrinter:
            with pytest.raises(ZeroDivisionError):
                writer.write()
            return
        writer.write()  # after_train's write of the same iteration
    assert len(printed) == 2


@pytest.mark.parametrize("beta", [4.0, math.inf])
def test_the_console_line_shows_instance_accuracy_nuclear_norm_with_the_prior_and_last_knn(
    beta, caplog
):
    writer = MetricPrinter(max_iter=100, window_size=3)
    with EventStorage(start_iter=0) as storage, caplog.at_level(logging.INFO):
        for it, acc in enumerate((0.5, 0.9, 0.8)):
            storage.iter = it
            storage.put_scalars(total_loss=1.0, inst_acc=acc, nuclear_norm=3.25, beta=beta)
            if it == 1:
                storage.put_scalar("knn/top1", 0.4567, smoothing_hint=False)
        writer.write()
    [line] = [r.getMessage() for r in caplog.records if "iter: 2" in r.getMessage()]
    assert "total_loss: 1" in line and "inst_acc: 80.0%" in line  # median of the window
    assert "knn/top1: 45.67% (iter 1)" in line
    assert ("||Q||_*: 3.25" in line) == math.isfinite(beta)  # only while the prior is on
