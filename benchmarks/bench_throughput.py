"""Pretraining throughput on synthetic data: images per second of the whole training step.

The step of ``PretrainTrainer.run_step`` without the data loader: random uint8 views already on
the device (the loader's output), colour augmentation on the device, the model (both encoders,
ShuffleBN, queues, loss) under the config's autocast, backward, the optimiser and the momentum
update. Default: the shipped IN-1K LORAC config (ResNet-50, 3x224 + 5x96, bfloat16,
channels_last) at 64 images per GPU, one process. ``make gpu-check`` runs it on a GPU and writes
its JSON; ``docs/performance.md`` explains the fields.

Run: .venv/bin/python -m benchmarks.bench_throughput [--device cuda] [--batch 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.common import report_json
from pretrain.config import load_config
from pretrain.data.color import sample_color_params
from pretrain.data.loader import augment_views_on_device, build_batch_augment
from pretrain.modeling import build_model
from pretrain.solver import build_optimizer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/pretrain/in1k_r50_lorac_200ep.yaml"


def measure(
    config: str = CONFIG,
    device: str = "cuda",
    batch: int = 64,
    iters: int = 20,
    warmup: int = 5,
    sizes: tuple[int, int] | None = None,
    queue: int | None = None,
) -> dict:
    """Figures of ``iters`` timed steps after ``warmup``; ``queue``: MODEL.QUEUE_SIZE (default:
    the config's, 65,536 for the shipped configs, so that the memory figure is the real one)."""
    opts = ["MODEL.DEVICE", device, "DATASETS.ROOT", "/synthetic", "SOLVER.IMS_PER_BATCH", batch]
    if queue is not None:
        opts += ["MODEL.QUEUE_SIZE", queue]
    if sizes is not None:
        opts += ["INPUT.LARGE_SIZE", sizes[0], "INPUT.SMALL_SIZE", sizes[1]]
    cfg = load_config(str(ROOT / config), [str(o) for o in opts])
    torch.backends.cudnn.benchmark = bool(cfg.CUDNN_BENCHMARK)
    model = build_model(cfg).to(device).train()
    optimizer = build_optimizer(cfg, model)
    color = build_batch_augment(cfg)
    amp = cfg.SOLVER.AMP
    dtype = getattr(torch, amp.PRECISION) if amp.ENABLED else None
    scaler = torch.amp.GradScaler(device) if dtype == torch.float16 else None
    g = torch.Generator().manual_seed(0)
    views = [
        torch.randint(0, 256, (batch, 3, s, s), dtype=torch.uint8, generator=g).to(device)
        for s in model.view_sizes
    ]
    spec = color.color

    def step(i: int) -> None:
        data = {
            "views": views,
            "seeds": torch.arange(batch) + i * batch,
            "shuffle_seeds": [i * 10 + j for j in range(cfg.INPUT.KEY_CROPS)],
            "color_params": [sample_color_params(batch, spec, g) for _ in views],
        }
        with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            data = augment_views_on_device(data, color, device, apply_color=True)
            out = model(data)
        loss = sum(v for k, v in out.items() if k.startswith("loss"))
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        model.momentum_update()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    for i in range(warmup):
        step(i)
    sync()
    start = time.perf_counter()
    for i in range(iters):
        step(warmup + i)
    sync()
    seconds = time.perf_counter() - start
    result = {
        "config": config,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "batch_per_process": batch,
        "queue_size": int(cfg.MODEL.QUEUE_SIZE),
        "view_sizes": list(model.view_sizes),
        "amp": amp.PRECISION if amp.ENABLED else "float32",
        "channels_last": bool(cfg.MODEL.CHANNELS_LAST),
        "cudnn_benchmark": bool(cfg.CUDNN_BENCHMARK),
        "iterations": iters,
        "seconds_per_iteration": seconds / iters,
        "images_per_second": batch * iters / seconds,
    }
    if device == "cuda":
        result["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--batch", type=int, default=64, help="images per process")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs=2, help="large and small view sizes")
    parser.add_argument("--queue", type=int, help="MODEL.QUEUE_SIZE (default: the config's)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but no CUDA device is visible (use --device cpu)")
    result = measure(
        args.config, args.device, args.batch, args.iters, args.warmup,
        tuple(args.sizes) if args.sizes else None, args.queue,
    )  # fmt: skip
    report_json(result, args.json)


if __name__ == "__main__":
    main()
