"""CUDA's own word on host syncs: a short run with ``torch.cuda.set_sync_debug_mode``.

``benchmarks/bench_step.py`` counts on the CPU what a GPU would synchronise on; this asks a GPU.
It trains a config for a few iterations (small generated images, the config's model, views, loss
and optimiser) and turns CUDA's sync detector on for every iteration that neither logs nor
checkpoints, in "warn" mode, so that each synchronising call (a value read, a blocking copy, an
op whose kernel waits, such as a linalg error check) is reported with the Python line it came
from. Prints and writes a table of (source line -> count per iteration).

Run (on a GPU): python -m benchmarks.cuda_sync_report [--config C ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import threading
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from detectron2.engine import HookBase
from PIL import Image

from pretrain.config import load_config
from pretrain.engine.trainer import PretrainTrainer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = [
    "configs/pretrain/in100_r18_lorac_beta2.yaml",
    "configs/pretrain/in100_r18_mocom.yaml",
    "configs/pretrain/in100_r18_mocov2.yaml",
]


class SyncDebug(HookBase):
    """CUDA's sync detector (``mode``) on the iterations that neither log nor checkpoint, from
    iteration ``first`` on.

    Each synchronising call is kept with the thread it ran in and its Python stack, and charged
    to the innermost frame of this project (``where``), where the call was asked for; a sync in
    torch's own Python is then charged to the project line that called it rather than to
    torch's file.

    Until 2026-11 this hook called ``torch.cuda.synchronize()`` itself before turning the
    detector on, and on an H100 and an H200 (torch 2.11) the first training of a process
    reported, in one iteration of four, one sync at ``torch/cuda/__init__.py:1270``. In torch
    2.14 that file's only synchronising Python is ``synchronize()`` (lines 1271-1281), and the
    only caller of it in a training process was this hook; the likeliest reading (not checked
    on a GPU: none was lent since) is that call, made while the detector was on. The hook now
    makes no call of its own in or around a checked window (it needed none: the detector
    reports a sync where it is made), and the stacks kept here name the caller of any sync
    that remains.
    """

    def __init__(self, mode: str = "warn", first: int = 2) -> None:
        self.mode, self.first = mode, first
        self.checked = 0
        self.syncs: list[dict] = []
        self._previous = None

    def before_step(self) -> None:
        flush_due = getattr(self.trainer, "_flush_due", lambda: False)()
        if self.trainer.iter >= self.first and not flush_due:
            self._previous = warnings.showwarning
            warnings.showwarning = self._keep
            torch.cuda.set_sync_debug_mode(self.mode)
            self.checked += 1

    def after_step(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        if self._previous is not None:
            warnings.showwarning, self._previous = self._previous, None

    def _keep(self, message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        if "synchroniz" not in str(message):
            return
        stack = traceback.extract_stack()[:-1]
        self.syncs.append(
            {
                "iteration": self.trainer.iter,
                "thread": threading.current_thread().name,
                "origin": f"{_short(filename)}:{lineno}",
                "where": _project_frame(stack) or f"{_short(filename)}:{lineno}",
                "stack": [f"{_short(f.filename)}:{f.lineno} ({f.name})" for f in stack[-12:]],
            }
        )


def _short(path: str) -> str:
    if path.startswith(str(ROOT)):
        return str(Path(path).relative_to(ROOT))
    return path.split("site-packages/")[-1]


def _project_frame(stack: list) -> str | None:
    """The innermost frame in this project's packages (not this file)."""
    for frame in reversed(stack):
        path = frame.filename
        if path.startswith(str(ROOT)) and not path.endswith("cuda_sync_report.py"):
            return f"{_short(path)}:{frame.lineno} ({frame.name})"
    return None


def _images(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True, exist_ok=True)
        for i in range(16):
            pixels = rng.integers(0, 256, (80, 80, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"c{c}" / f"{i}.png")
    return root


def report(config: str, extra: list[str] | None = None, iters: int = 8) -> dict:
    """Syncs per checked iteration, by source line, of ``config`` trained ``iters`` steps."""
    with tempfile.TemporaryDirectory() as tmp:
        data = _images(Path(tmp) / "data")
        opts = {
            "DATASETS.TYPE": "imagefolder", "DATASETS.ROOT": str(data),
            "DATASETS.CLASS_LIST": "", "OUTPUT_DIR": str(Path(tmp) / "out"),
            "MODEL.DEVICE": "cuda", "MODEL.QUEUE_SIZE": 64, "SOLVER.IMS_PER_BATCH": 8,
            "INPUT.LARGE_SIZE": 64, "INPUT.SMALL_SIZE": 32, "SOLVER.MAX_ITER": iters,
            "SOLVER.LOG_PERIOD": iters - 1, "SOLVER.CHECKPOINT_PERIOD": 1000,
            "LOSS.BETA_INF_EPOCHS": 0.0, "TEST.KNN_PERIOD": 0, "DATALOADER.NUM_WORKERS": 2,
        }  # fmt: skip
        flat = [str(x) for kv in opts.items() for x in kv] + list(extra or [])
        trainer = PretrainTrainer(load_config(str(ROOT / config), flat))
        hook = SyncDebug("warn")
        trainer.register_hooks([hook])
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            try:
                trainer.train()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(s["where"] for s in hook.syncs)
    n = max(hook.checked, 1)
    return {
        "config": config,
        "checked_iterations": hook.checked,
        "syncs_per_iteration": len(hook.syncs) / n,
        "by_source": {k: v / n for k, v in where.most_common()},
        "syncs": hook.syncs,  # each with its iteration, thread, origin and stack
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", default=DEFAULT_CONFIGS)
    parser.add_argument("--opts", nargs="*", default=[], help="KEY VALUE config overrides")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: cuda_sync_report needs a CUDA device")
    results = [report(c, args.opts) for c in args.config]
    for r in results:
        print(f"{Path(r['config']).stem}: {r['syncs_per_iteration']:g} syncs per iteration")
        for where, n in r["by_source"].items():
            print(f"    {n:g} x {where}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
