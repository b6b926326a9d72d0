"""What the benchmark scripts share: interleaved timings (machine noise hits all candidates
alike), the JSON report, and the project's step built from a shipped config and trained on a few
replayed loader batches."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from fvcore.common.config import CfgNode

import pretrain.engine.trainer as trainer_module
from pretrain.config import load_config
from pretrain.data.loader import build_pretrain_loader, shuffle_plans
from pretrain.diagnostics.step_count import toy_opts

ROOT = Path(__file__).resolve().parents[1]
# real photographs beside the checkout
PHOTOS = ROOT.parent / "shared" / "data" / "fruits-coco" / "images"
IN1K_CONFIGS = [
    "configs/pretrain/in1k_r50_lorac_200ep.yaml",
    "configs/pretrain/in1k_r50_mocom_200ep.yaml",
    "configs/pretrain/in1k_r50_mocov2_200ep.yaml",
]
POOL = 2  # distinct loader batches replayed in turn


def interleaved_timings(
    fns: dict[str, Callable[[], object]], repeats: int = 10, inner: int = 5, warmup: int = 3
) -> dict[str, float]:
    """Median seconds per call of each function, measured round-robin in one process."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner)
    return {k: statistics.median(v) for k, v in samples.items()}


def write_json(result: Any, path: str) -> None:
    """``result`` as JSON at ``path`` (parents created)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=1))


def report_json(result: dict, path: str | None) -> None:
    """Print ``result`` as JSON and, with ``path``, also write it there."""
    print(json.dumps(result, indent=1))
    if path:
        write_json(result, path)


def check_cuda(parser: argparse.ArgumentParser, device: str) -> None:
    """One error line (exit status 2) for ``--device cuda`` without a visible GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        parser.exit(2, "error: --device cuda but no CUDA device is visible (use --device cpu)\n")


def project_cfg(
    config: str, device: str, batch: int, total_iters: int, tmp: Path, images: bool = True,
    sizes: tuple[int, int] | None = None, queue: int | None = None, opts: tuple | list = (),
) -> CfgNode:  # fmt: skip
    """``config`` for one process of ``batch`` images over generated images in ``tmp``/data
    (``images`` False: none made, to check the overrides), writing under ``tmp``. ``sizes``: the
    large and small view sizes; ``queue``: MODEL.QUEUE_SIZE (default: the config's). The final
    checkpoint (detectron2 writes one at MAX_ITER) comes one iteration after the last timed one,
    and so does the one logging iteration (the step's values read on the host, the writers):
    the ``total_iters`` iterations are steady-state steps. The prior is on from the first
    iteration (the costlier phase)."""
    keys = {
        "MODEL.DEVICE": device,
        "SOLVER.IMS_PER_BATCH": batch,
        "SOLVER.MAX_ITER": total_iters + 1,
        # no periodic save: detectron2 writes model_final only (at MAX_ITER a period dividing
        # it would write the same state twice)
        "SOLVER.CHECKPOINT_PERIOD": total_iters + 2,
        # one flush of the step records, at MAX_ITER: none drains the device in a timed step
        "SOLVER.LOG_PERIOD": total_iters + 1,
        "DATALOADER.NUM_WORKERS": 0,  # the loader only fills the replayed pool
    }
    if queue is not None:
        keys["MODEL.QUEUE_SIZE"] = queue
    if sizes is not None:
        keys["INPUT.LARGE_SIZE"], keys["INPUT.SMALL_SIZE"] = sizes
    flat = toy_opts(tmp, keys, opts, per_class=max(16, math.ceil(batch / 2)), images=images)
    return load_config(str(ROOT / config), flat)


def _replayed_loader(cfg: CfgNode, source: Any) -> Callable[..., Iterator[dict]]:
    """A stand-in for ``build_pretrain_loader``: the real loader's first :data:`POOL` batches,
    replayed with each iteration's number and ShuffleBN plans."""
    loader = iter(build_pretrain_loader(cfg, 0, 1, 0, source, procs_on_machine=1))
    pool = [next(loader) for _ in range(POOL)]
    del loader

    def build(cfg: CfgNode, rank: int, world: int, start_iter: int, source: Any) -> Iterator:
        def batches() -> Iterator[dict]:
            for it in range(start_iter, 1 << 62):
                batch = pool[it % POOL]
                crops, b = len(batch["shuffle_plans"]), len(batch["seeds"])
                splits = cfg.MODEL.KEY_BN_SPLITS
                plans = shuffle_plans(
                    cfg.SEED, it, crops, world=world, rank=rank, b=b, splits=splits
                )
                yield {**batch, "iteration": it, "shuffle_plans": plans}

        return batches()

    return build


def train_on_replays(trainer: trainer_module.PretrainTrainer) -> None:
    """``trainer.train()`` fed from a few batches of its real loader, replayed: no decoding in
    the timed iterations, so that a figure is the step's."""
    replayed = _replayed_loader(trainer.cfg, trainer.source)
    with mock.patch.object(trainer_module, "build_pretrain_loader", replayed):
        trainer.train()
