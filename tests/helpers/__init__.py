"""Helpers shared by the tests: the repository root, tiny generated datasets and a tiny
pretraining config. No tests and no fixtures here (fixtures live in ``tests/conftest.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
from PIL import Image

# The packages come from the install (`pip install -e .`, `make venv`), not from this path.
ROOT = Path(__file__).resolve().parents[2]


def group_alive(pgid: int) -> bool:
    """Whether any process is left in process group ``pgid`` (a tool started in its own session)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def interrupt_group(proc: subprocess.Popen) -> str:
    """SIGINT to a tool's process group (started in its own session), as a terminal's Ctrl-C;
    its stderr once it ended, and no process of the group left (its data workers end with it)."""
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    deadline = time.monotonic() + 10
    while group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not group_alive(proc.pid), "a process of the tool outlived it"
    return err


def make_image_folder(root: Path, classes: int = 2, per_class: int = 12, size: int = 40) -> Path:
    """Generated RGB JPEG/PNG images: a class-dependent texture plus per-image random colours and
    rectangles, so that instances are distinguishable (as real photos are)."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:size, 0:size] / size
    for c in range(classes):
        d = root / f"class{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            base = np.ones((size, size, 3)) * rng.uniform(0, 1, 3)
            base[..., c % 3] += 0.3 * np.sin((c + 1) * 6 * xx)
            for _ in range(3):
                x0, y0 = rng.integers(0, size - 8, 2)
                w, h = rng.integers(6, size // 2, 2)
                base[y0 : y0 + h, x0 : x0 + w] = rng.uniform(0, 1, 3)
            base += rng.normal(0, 0.03, base.shape)
            img = Image.fromarray((np.clip(base, 0, 1) * 255).astype(np.uint8))
            img.save(d / f"img{i}.{'jpg' if i % 2 else 'png'}")
    return root


def tiny_opts(root: Path, out: Path, **extra) -> list[str]:
    """Overrides turning the demo config into a seconds-long CPU run on ``root``."""
    opts = {
        "DATASETS.TYPE": "imagefolder",
        "DATASETS.ROOT": str(root),
        "OUTPUT_DIR": str(out),
        "MODEL.QUEUE_SIZE": 32,
        "MODEL.HEAD_HIDDEN_DIM": 64,
        "MODEL.HEAD_OUT_DIM": 16,
        "INPUT.LARGE_SIZE": 32,
        "INPUT.SMALL_SIZE": 16,
        "SOLVER.IMS_PER_BATCH": 8,
        "SOLVER.MAX_ITER": 6,
        "SOLVER.CHECKPOINT_PERIOD": 3,
        "SOLVER.LOG_PERIOD": 1,
        "DATALOADER.NUM_WORKERS": 0,
        "LOSS.BETA_INF_EPOCHS": 0.0,
        # float32, contiguous: the demo config's bfloat16 + channels-last CPU kernels give results
        # that depend on the thread count, and many tests compare runs bit for bit (resume, one
        # process vs two, --jobs). Tests of the AMP path pass these keys themselves.
        "SOLVER.AMP.ENABLED": False,
        "MODEL.CHANNELS_LAST": False,
    }
    opts.update(extra)
    return [str(x) for kv in opts.items() for x in kv]
