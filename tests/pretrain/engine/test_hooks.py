"""The stop-on-signal hook on a fake trainer: the signal is recorded, the stop happens at the
next step boundary."""

from __future__ import annotations

import os
import signal

import pytest

from pretrain.engine.hooks import Preempted, StopOnSignal


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
