"""SIGKILL at random instants while full trainer checkpoints are being written.

A preempted job that outlives its grace period is SIGKILLed, possibly mid-write. The previous
checkpoint must stay loadable (``weights_only=True``), ``last_checkpoint`` must name a complete
file, and the trainer's auto-resume must continue from it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from pretrain.config import load_config
from pretrain.engine.trainer import PretrainTrainer
from tests.helpers import ROOT, make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG

# Saves the whole trainer state (ResNet-18 query + key encoders, LARS momentum: ~140 MB) in a
# loop with the trainer's own checkpointer, continuing the numbering after the last one.
WRITER = """
import os
from pretrain.config import load_config
from pretrain.engine.trainer import PretrainTrainer
trainer = PretrainTrainer(load_config({config!r}, {opts!r}))
ckpt = trainer.checkpointer
start = trainer.iter + 1 if trainer.resume() else 0
for i in range(start, start + 1000):
    trainer.iter = i
    ckpt.save(f"model_{{i:07d}}", iteration=i)
    if i == start:
        print("first save done", flush=True)
    old = os.path.join(ckpt.save_dir, f"model_{{i - 2:07d}}.pth")
    if os.path.exists(old):
        os.remove(old)  # keep the disk bounded, as max_to_keep does
"""


def _kill_mid_write(out: Path, proc: subprocess.Popen, delay: float) -> None:
    """SIGKILL ``delay`` s after the next checkpoint's temporary file appears."""
    end = time.time() + 60
    while not list(out.glob(".tmp-model_*")) and time.time() < end:
        time.sleep(0.002)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)


def test_sigkill_during_checkpoint_writes_keeps_last_checkpoint_loadable(tmp_path):
    """Three writer processes, each killed once: at a random instant, then twice at a random
    point shortly after a write began (so a torn write is certain to be exercised)."""
    data = make_image_folder(tmp_path / "data", per_class=8)
    out = tmp_path / "run"
    opts = tiny_opts(data, out)
    code = WRITER.format(config=DEMO_CONFIG, opts=opts)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rng = random.Random(0)
    iterations = []
    for mid_write in (False, True, True):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                env=env, cwd=ROOT)  # fmt: skip
        assert proc.stdout.readline() == "first save done\n", proc.communicate()
        if mid_write:
            _kill_mid_write(out, proc, rng.uniform(0.0, 0.02))
        else:
            time.sleep(rng.uniform(0.0, 1.5))
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        # a kill inside a write leaves only its temporary file behind, never a partial .pth
        torn = list(out.glob(".tmp-*"))
        assert torn or not mid_write, "the kill missed the write it aimed at"
        for tmp in torn:
            tmp.unlink()
        name = (out / "last_checkpoint").read_text()
        ckpt = torch.load(out / name, weights_only=True)  # complete, loadable without pickle code
        it = ckpt["trainer"]["iteration"]
        assert name == f"model_{it:07d}.pth" and it == ckpt["iteration"]
        iterations.append(it)
    assert iterations == sorted(iterations) and len(set(iterations)) == 3  # each run moved on
    trainer = PretrainTrainer(load_config(DEMO_CONFIG, opts))
    assert trainer.resume()
    assert trainer.start_iter == iterations[-1] + 1
