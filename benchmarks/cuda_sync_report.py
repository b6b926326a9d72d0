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
    """CUDA's sync detector (``mode``) on the iterations that neither log nor checkpoint."""

    def __init__(self, mode: str = "warn") -> None:
        self.mode = mode
        self.checked = 0

    def before_step(self) -> None:
        flush_due = getattr(self.trainer, "_flush_due", lambda: False)()
        # from iteration 2: on an H200 (torch 2.11) the first training of a process made one
        # sync inside torch.cuda's own Python (torch/cuda/__init__.py) in one early iteration
        if self.trainer.iter >= 2 and not flush_due:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode(self.mode)
            self.checked += 1

    def after_step(self) -> None:
        torch.cuda.set_sync_debug_mode("default")


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
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                trainer.train()
            finally:
                torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(
        f"{Path(w.filename).relative_to(ROOT) if w.filename.startswith(str(ROOT)) else w.filename}"
        f":{w.lineno}"
        for w in caught
        if "synchroniz" in str(w.message)
    )
    n = max(hook.checked, 1)
    return {
        "config": config,
        "checked_iterations": hook.checked,
        "syncs_per_iteration": sum(where.values()) / n,
        "by_source": {k: v / n for k, v in where.most_common()},
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
