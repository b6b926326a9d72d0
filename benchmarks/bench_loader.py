"""The pretraining data loader per core, stage by stage, on real photos at ImageNet sizes.

The photos: ``--images`` crops and flips of the photographs of ``../shared/data/fruits-coco`` at
ImageNet's usual sizes (500x375 mostly), re-encoded as 4:2:0 JPEGs at ``--quality`` (about 70 KB
each, as ImageNet's), in a temporary folder. On one thread (as in a data worker), over batches
of ``IMS_PER_BATCH / --gpus`` images, in CPU time (a shared machine stretches wall time, not CPU
time), the median of ``--repeats`` interleaved rounds of each stage:

* **decode**: ``ImageFolderSource.load_rgb`` (read, decode, RGB uint8 tensor);
* **crops**: the dataset item without the decode (the multi-crop views and colour parameters
  of ``--config``, as the trainer builds them);
* **collate**: the loader's ``collate_fn``;
* **to shared memory**: ``share_memory_()`` of each collated tensor, as a worker's result queue
  does;
* **loader**: ``build_pretrain_loader`` with one worker, in images per CPU second of the worker
  process (``/proc``), with the main process's CPU time and the wall-clock rate beside it.

It ends with the projection for ``--cores`` cores per GPU (``cores - 1`` workers times the
loader's images per core); ``--workers W ...`` also times the loader with W workers (images per
wall-clock second of the whole machine).

Run: .venv/bin/python -m benchmarks.bench_loader [--images 500] [--quality 90] [--repeats 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from fvcore.common.config import CfgNode
from PIL import Image

from common import PHOTOS, ROOT
from pretrain.config import load_config
from pretrain.data.datasets import ImageFolderSource
from pretrain.data.loader import PretrainDataset, build_pretrain_loader, build_train_transform
from pretrain.data.sampler import IterationBatchSampler

CONFIG = "configs/pretrain/in1k_r50_lorac_200ep.yaml"
# (width, height) of ImageNet photos, weighted as they are common: 500x375 landscape first.
SIZES = [(500, 375)] * 4 + [(375, 500)] * 2 + [(500, 400), (500, 500), (400, 500), (480, 400)]


def make_photos(folder: Path, n: int, quality: int, photos: Path = PHOTOS, seed: int = 0) -> None:
    """``n`` JPEGs in ``folder/n00000000/``: crops of the photos resized to ImageNet sizes."""
    sources = sorted(photos.glob("*.jpg"))
    if not sources:
        raise SystemExit(f"{photos}: no JPEG photos (expected ../shared/data/fruits-coco/images)")
    rng = np.random.default_rng(seed)
    out = folder / "n00000000"
    out.mkdir(parents=True)
    decoded = [Image.open(p).convert("RGB") for p in sources]
    for i in range(n):
        img = decoded[i % len(decoded)]
        w, h = SIZES[int(rng.integers(len(SIZES)))]
        # the largest box of the target's aspect ratio, scaled by 0.6-1, somewhere in the photo
        s = min(img.width / w, img.height / h) * float(rng.uniform(0.6, 1.0))
        bw, bh = round(w * s), round(h * s)
        x0 = int(rng.integers(0, img.width - bw + 1))
        y0 = int(rng.integers(0, img.height - bh + 1))
        pic = img.crop((x0, y0, x0 + bw, y0 + bh)).resize((w, h), Image.Resampling.LANCZOS)
        if rng.random() < 0.5:
            pic = pic.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pic.save(out / f"img_{i:04d}.JPEG", quality=quality, subsampling="4:2:0")


def _decoder(source: ImageFolderSource) -> Callable[[int], object]:
    # load_rgb (a uint8 RGB tensor) where the source has it, else load (a PIL image), so that this
    # file also measures a source that only offers load
    return getattr(source, "load_rgb", None) or source.load


class _Decoded:
    """A source whose images are decoded already: the crops stage without the decode."""

    def __init__(self, images: list) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def load(self, index: int) -> object:
        return self.images[index]

    load_rgb = load

    def describe(self, index: int) -> str:
        return f"decoded[{index}]"


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interleaved_cpu_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median CPU seconds of each function over ``repeats`` round-robin rounds, after a warm-up
    round. A function that returns a float returns its own CPU seconds (it times a part)."""
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(repeats + 1):
        for name, fn in fns.items():
            t0 = time.process_time()
            own = fn()
            if r:
                own = own if isinstance(own, float) else time.process_time() - t0
                samples[name].append(own)
    return {k: statistics.median(v) for k, v in samples.items()}


def measure_loader(cfg: CfgNode, gpus: int, iters: int, warmup: int = 3) -> dict[str, float]:
    """The trainer's loader with one worker: images per CPU second of the worker, the main
    process's CPU milliseconds per image (receiving the batches), images per wall second."""
    loader = build_pretrain_loader(cfg, 0, gpus, 0)
    batch = cfg.SOLVER.IMS_PER_BATCH // gpus
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    (worker,) = multiprocessing.active_children()  # the loader's one worker
    cpu0, main0, t0 = _cpu_seconds(worker.pid), time.process_time(), time.perf_counter()
    for _ in range(iters):
        next(it)
    wall = time.perf_counter() - t0
    main = time.process_time() - main0
    cpu = _cpu_seconds(worker.pid) - cpu0
    n = iters * batch
    return {"per_core": n / cpu, "main_ms": main / n * 1e3, "wall": n / wall}


def measure_workers(cfg: CfgNode, gpus: int, workers: int, iters: int) -> float:
    """Images per wall-clock second of the trainer's loader with ``workers`` workers, timed
    once the prefetched batches of the start are consumed."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.DATALOADER.NUM_WORKERS = workers
    it = iter(build_pretrain_loader(cfg, 0, gpus, 0))
    for _ in range(6 * workers):  # every worker started; the prefetch queue drained
        next(it)
    t0 = time.perf_counter()
    for _ in range(iters):
        next(it)
    return iters * (cfg.SOLVER.IMS_PER_BATCH // gpus) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=CONFIG)
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of the photo set")
    p.add_argument("--gpus", type=int, default=8, help="processes sharing IMS_PER_BATCH")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--loader-iters", type=int, default=40, help="batches the loader is timed on")
    p.add_argument("--cores", type=int, default=16, help="cores per GPU, for the projection")
    p.add_argument("--photos", type=Path, default=PHOTOS, help="folder of .jpg photos")
    p.add_argument("--workers", type=int, nargs="*", default=[],
                   help="also time the loader with this many workers (wall clock)")  # fmt: skip
    p.add_argument("--workers-iters", type=int, default=300, help="batches timed for --workers")
    args = p.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as tmp:
        make_photos(Path(tmp), args.images, args.quality, args.photos)
        kb = statistics.mean(f.stat().st_size for f in Path(tmp).glob("*/*.JPEG")) / 1024
        opts = ["DATASETS.ROOT", tmp, "MODEL.DEVICE", "cpu", "DATALOADER.NUM_WORKERS", "1"]
        cfg = load_config(str(ROOT / args.config), opts)
        source = ImageFolderSource(tmp)
        n, batch = len(source), cfg.SOLVER.IMS_PER_BATCH // args.gpus
        print(f"{n} photos from {args.photos} at ImageNet sizes, JPEG quality {args.quality}, "
              f"mean {kb:.0f} KB; {args.config}, batches of {batch} (IMS_PER_BATCH / "
              f"{args.gpus}); 1 thread; CPU time")  # fmt: skip

        decode = _decoder(source)
        transform, color = build_train_transform(cfg)
        dataset = PretrainDataset(
            _Decoded([decode(i) for i in range(n)]),
            transform,
            color if cfg.INPUT.COLOR_ON_DEVICE else None,
        )
        # the first iterations of an epoch, as (index, per-sample seed, iteration) items
        sampler = iter(IterationBatchSampler(n, batch, 0, 1, cfg.SEED, 0))
        chunks = [[(i, s, it) for i, s in next(sampler)] for it in range(n // batch)]
        items = [item for chunk in chunks for item in chunk]
        collate = build_pretrain_loader(cfg, 0, args.gpus, 0, source).collate_fn
        batches = [[dataset[item] for item in chunk] for chunk in chunks]

        def to_shared() -> float:
            """CPU seconds to move freshly collated batches to shared memory."""
            outs = [collate(b) for b in batches]
            t0 = time.process_time()
            for out in outs:
                tensors = [*out["views"], out["index"], out["seeds"]]
                for params in out["color_params"] or []:
                    tensors += list(params.tensors.values())
                for t in tensors:
                    t.share_memory_()
            return time.process_time() - t0

        seconds = interleaved_cpu_times(
            {
                "decode": lambda: [decode(i) for i, _, _ in items],
                "crops": lambda: [dataset[item] for item in items],
                "collate": lambda: [collate(b) for b in batches],
                "to shared memory": to_shared,
            },
            args.repeats,
        )
        rates = {k: len(items) / s for k, s in seconds.items()}
        loader = measure_loader(cfg, args.gpus, args.loader_iters)
        machine = {w: measure_workers(cfg, args.gpus, w, args.workers_iters) for w in args.workers}

    print(f"{'stage':28s} {'img/s per core':>15s} {'ms/img':>8s}")
    for k, r in rates.items():
        print(f"{k:28s} {r:15.0f} {1e3 / r:8.3f}")
    chain = 1.0 / sum(1.0 / r for r in rates.values())
    print(f"{'the four stages':28s} {chain:15.0f} {1e3 / chain:8.3f}")
    per_core = loader["per_core"]
    print(f"{'loader, 1 worker':28s} {per_core:15.0f} {1e3 / per_core:8.3f}   (main process: "
          f"{loader['main_ms']:.3f} ms/img; wall clock {loader['wall']:.0f} img/s)")  # fmt: skip
    workers = args.cores - 1
    print(f"projection, {args.cores} cores per GPU ({workers} workers + the training process): "
          f"{workers * per_core:,.0f} img/s per GPU")  # fmt: skip
    for w, rate in machine.items():
        print(f"measured: the loader with {w} workers on this machine's {os.cpu_count()} cores: "
              f"{rate:,.0f} img/s (wall clock)")  # fmt: skip


if __name__ == "__main__":
    main()
