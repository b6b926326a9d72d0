"""Stop-on-signal as SLURM delivers it: to every process of the run, data-loader workers included.

A pretraining run with 1 or 2 data-loader workers runs in its own process group (as a SLURM job
step does); after iteration 2 the test signals the whole group (``os.killpg``). The run must save
``model_0000002.pth`` at that boundary, exit with status 0 without a traceback, leave no process
of the group behind, and, resumed, end with exactly the weights of an uninterrupted run.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from detectron2.engine import HookBase

from pretrain.config import load_config
from pretrain.engine.hooks import Preempted
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, group_alive, make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG

STOP_AFTER = 2
# no periodic checkpoint before the end: a mid-run checkpoint can only come from the signal
BASE = {"SOLVER.MAX_ITER": 6, "SOLVER.CHECKPOINT_PERIOD": 100}
# outside SLURM, whatever the machine running the tests: SIGUSR2's requeue must be a no-op
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
ENV.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")

# The job SLURM would run (setup, logging, trainer, resume, train), plus a hook that announces
# the end of iteration STOP_AFTER and waits there until the test's signal has reached the trainer.
RUNNER = """
import multiprocessing
import time
from detectron2.engine import HookBase
from pretrain.cluster.jobs import PretrainJob

class WaitForSignal(HookBase):
    def after_step(self):
        if self.trainer.iter == {stop}:
            open({flag!r}, "w").close()
            end = time.time() + 60
            while not self.trainer.stop_on_signal.pending and time.time() < end:
                time.sleep(0.01)
            time.sleep(0.5)  # time for the signal to kill the workers, were they not shielded
            # the trainer's children: its data-loader workers
            alive = [w.is_alive() for w in multiprocessing.active_children()]
            print("workers alive after the signal:", alive, flush=True)

PretrainJob({config!r}, {opts!r}, [WaitForSignal()])()
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_image_folder(tmp_path_factory.mktemp("signals") / "data")


def _train(opts: list[str], hooks: list | None = None) -> PretrainTrainer:
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, opts))
    trainer.register_hooks(hooks or [])
    trainer.resume()
    trainer.train()
    return trainer


def _params(trainer: PretrainTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and "queues" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted run (no workers: the data do not depend on them)."""
    out = tmp_path_factory.mktemp("signals") / "reference"
    return _params(_train(tiny_opts(data, out, **BASE)))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR2], ids=["SIGTERM", "SIGUSR2"])
def test_signal_to_the_whole_group_saves_exits_0_and_resumes_exactly(
    data, reference, tmp_path, workers, sig
):
    out, flag = tmp_path / "run", tmp_path / "at_boundary"
    opts = tiny_opts(data, out, **BASE, **{"DATALOADER.NUM_WORKERS": workers})
    code = RUNNER.format(stop=STOP_AFTER, flag=str(flag), config=DEMO_CONFIG, opts=opts)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT,
                            start_new_session=True)  # fmt: skip
    try:
        end = time.time() + 300
        while not flag.exists() and proc.poll() is None and time.time() < end:
            time.sleep(0.02)
        assert flag.exists(), proc.communicate(timeout=60)[1][-3000:]
        children = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True)
        assert len(children.stdout.split()) >= 1 + workers  # the workers are running
        os.killpg(proc.pid, sig)  # as SLURM does: every process of the run
        stdout, err = proc.communicate(timeout=120)  # nothing hangs
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    name = sig.name
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    assert f"stopped after iteration {STOP_AFTER} ({name})" in err
    # the workers ignored the signal meant for the trainer, which then shut them down itself
    assert f"workers alive after the signal: {[True] * workers}" in stdout
    assert not group_alive(proc.pid)  # none is left behind
    log = (out / "log.txt").read_text()
    assert f"{name}: stopping after iteration {STOP_AFTER}, saving model_0000002.pth" in log
    if sig == signal.SIGUSR2:
        assert "not running under SLURM: nothing to requeue" in log
    assert (out / "last_checkpoint").read_text() == "model_0000002.pth"
    ckpt = torch.load(out / "model_0000002.pth", weights_only=True)
    assert ckpt["iteration"] == ckpt["trainer"]["iteration"] == STOP_AFTER
    assert not (out / "model_final.pth").exists()

    resumed = _train(opts)
    assert resumed.start_iter == STOP_AFTER + 1
    _assert_same(reference, _params(resumed))


class _SignalThenKillWorker(HookBase):
    """After iteration ``at``: SIGTERM to this process, then SIGKILL to every data-loader worker
    (a worker the stop signal killed before it could protect itself), then wait for SIGCHLD."""

    def __init__(self, at: int):
        self.at = at

    def before_train(self):
        # this process's children before the loader starts its workers (other tests' leftovers)
        self.others = {p.pid for p in multiprocessing.active_children()}

    def after_step(self):
        if self.trainer.iter != self.at:
            return
        os.kill(os.getpid(), signal.SIGTERM)
        workers = [p for p in multiprocessing.active_children() if p.pid not in self.others]
        assert workers  # the loader's (DATALOADER.NUM_WORKERS 1)
        for w in workers:
            os.kill(w.pid, signal.SIGKILL)
        for w in workers:  # dead, and not reaped (as join would), so torch's check sees them
            end = time.time() + 30
            while _state(w.pid) != "Z" and time.time() < end:
                time.sleep(0.01)
        time.sleep(0.2)  # SIGCHLD: torch's handler would raise here, in the middle of the run


def _state(pid: int) -> str:
    """The state letter of a process (Z: a zombie, dead but not waited for)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_workers_killed_while_stopping_still_give_the_checkpoint(data, reference, tmp_path):
    """Dead workers after a stop signal are part of the stop, not an error: the run saves the
    last completed iteration (whether or not a prefetched batch was left) and resumes exactly."""
    opts = tiny_opts(data, tmp_path / "run", **BASE, **{"DATALOADER.NUM_WORKERS": 1})
    with pytest.raises(Preempted, match=f"stopped after iteration {STOP_AFTER} .SIGTERM."):
        _train(opts, [_SignalThenKillWorker(STOP_AFTER)])
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    assert (tmp_path / "run" / "last_checkpoint").read_text() == "model_0000002.pth"
    _assert_same(reference, _params(_train(opts)))


class _BrokenLoader:
    """A loader whose worker died: its next batch raises as torch does from ``next``."""

    def __iter__(self):
        return self

    def __next__(self):
        raise RuntimeError("DataLoader worker (pid(s) 12345) exited unexpectedly")


class _SignalAndBreakLoader(HookBase):
    """After iteration ``at``: ``signum`` (if any) to this process, and the loader broken, so
    that the batch of iteration ``at + 1`` cannot be fetched."""

    def __init__(self, at: int, signum: int | None):
        self.at, self.signum = at, signum

    def after_step(self):
        if self.trainer.iter == self.at:
            if self.signum is not None:
                os.kill(os.getpid(), self.signum)
            self.trainer.reset_data_loader(_BrokenLoader)


def test_batch_lost_after_a_stop_signal_stops_before_it(data, tmp_path):
    """The batch of iteration 3 cannot be fetched after SIGTERM: stop after iteration 2."""
    out = tmp_path / "run"
    opts = tiny_opts(data, out, **BASE)
    with pytest.raises(Preempted, match="stopped after iteration 2 .SIGTERM."):
        _train(opts, [_SignalAndBreakLoader(2, signal.SIGTERM)])
    assert (out / "last_checkpoint").read_text() == "model_0000002.pth"
    assert torch.load(out / "model_0000002.pth", weights_only=True)["iteration"] == 2


def test_batch_lost_without_a_signal_is_an_error(data, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        _train(tiny_opts(data, out, **BASE), [_SignalAndBreakLoader(2, None)])
    assert not (out / "last_checkpoint").exists()
