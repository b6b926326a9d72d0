"""Cost of one evaluation of the kNN monitor (docs/performance.md, "The kNN monitor").

Builds the monitor as the trainer does (``build_knn_hook``) over a generated ImageFolder of
ImageNet-like JPEGs (crops of ``../shared/data/fruits-coco`` at 500x375 / 375x500, quality 95, in
a temporary folder or ``--data DIR``) and times whole evaluations (``KNNHook.compute``) on 1 or
more processes: the main process's wall time, each process's embedding time and images/s, the
longest wait at the gather. ``--model none`` replaces the backbone by a per-image mean (the data
path alone); ``--as-rank-of W`` gives one process the largest share of a W-process run;
``--knn`` also times the kNN alone on random features of the config's full sizes.

Run: .venv/bin/python -m benchmarks.bench_knn_monitor [--config C] [--procs 1 2] [--workers 0 1]
     [--model backbone none] [--as-rank-of W] [--repeats N] [--device cpu] [--knn] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
from detectron2.engine import launch
from detectron2.utils import comm
from fvcore.common.config import CfgNode
from PIL import Image
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from common import PHOTOS, ROOT, interleaved_timings, write_json
from pretrain.config import load_config
from pretrain.data.datasets import read_class_list
from pretrain.evaluation.features import batch_shards
from pretrain.evaluation.knn import knn_accuracy
from pretrain.evaluation.knn_monitor import build_knn_hook
from pretrain.modeling import build_model
from pretrain.utils.pixels import normalize_, to_unit_float

CONFIG = "configs/pretrain/Base-IN100-R18.yaml"
VARIANTS = 240  # distinct JPEGs; the folder repeats them (decoding cost is per file, not unique)


def make_imagenet_like(
    root: Path, classes: list[str], train: int, val: int, photos_dir: Path = PHOTOS
) -> dict:
    """``root/{train,val}/<class>/*.JPEG``: ``train`` and ``val`` images spread over ``classes``
    (crops of the JPEGs in ``photos_dir``); returns the mean file size."""
    rng = random.Random(0)
    photos = sorted(photos_dir.glob("*.jpg"))
    if not photos:
        raise SystemExit(f"{photos_dir}: no photographs (../shared/data/fruits-coco/images)")
    variants = []
    pool = root / "pool"
    pool.mkdir(parents=True, exist_ok=True)
    for i in range(VARIANTS):
        with Image.open(rng.choice(photos)) as img:
            w, h = img.size
            cw, ch = int(w * rng.uniform(0.6, 1.0)), int(h * rng.uniform(0.6, 1.0))
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            size = (500, 375) if rng.random() < 0.75 else (375, 500)
            out = img.crop((x, y, x + cw, y + ch)).resize(size, Image.BICUBIC)
            if rng.random() < 0.5:
                out = out.transpose(Image.FLIP_LEFT_RIGHT)
            path = pool / f"v{i}.JPEG"
            out.save(path, quality=95)
            variants.append(path)
    n = 0
    for split, count in (("train", train), ("val", val)):
        for j in range(count):
            d = root / split / classes[j * len(classes) // count]
            d.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(variants[n % VARIANTS], d / f"{split}_{j:06d}.JPEG")
            n += 1
    sizes = [p.stat().st_size for p in variants]
    return {"mean_kb": sum(sizes) / len(sizes) / 1e3, "variants": VARIANTS}


class _Mean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().mean(dim=(2, 3))  # (B, 3)


class _DataOnly(nn.Module):
    """What ``build_knn_hook`` reads of a model, with a backbone that only averages."""

    def __init__(self, device: str) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.backbone = _Mean()

    def backbone_features(self, images: torch.Tensor) -> torch.Tensor:
        x = normalize_(to_unit_float(images.to(self.device, non_blocking=True)))
        return self.backbone(x)


def _shares(cfg: CfgNode, world: int) -> list[tuple[int, int]]:
    """(references, queries) of each process of a ``world``-process run."""
    t = cfg.TEST
    counts = [t.KNN_TRAIN_IMAGES, t.KNN_TEST_IMAGES]
    return [
        tuple(len(s) for s in batch_shards(counts, t.KNN_BATCH_SIZE, r, world))
        for r in range(world)
    ]


def _evaluate(config: str, opts: list[str], model_kind: str, repeats: int, out: str) -> None:
    """One process: build the monitor as the trainer does and time ``repeats`` evaluations."""
    world, rank = comm.get_world_size(), comm.get_rank()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    cfg = load_config(config, opts)
    device = cfg.MODEL.DEVICE
    if device == "cuda":
        torch.cuda.set_device(comm.get_local_rank())
    torch.backends.cudnn.benchmark = bool(cfg.CUDNN_BENCHMARK)
    if model_kind == "none":
        model: nn.Module = _DataOnly(device)
    else:
        torch.manual_seed(0)
        model = build_model(cfg, world).to(device).train()
        if world > 1:
            ids = [comm.get_local_rank()] if device == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
    hook = build_knn_hook(cfg, model)
    shares = [sum(share) for share in _shares(cfg, world)]
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        top1 = hook.compute()
        wall = time.perf_counter() - start
        if top1 is not None:
            runs.append(
                {
                    "wall_s": wall,
                    "embed_s": hook.last_seconds,
                    "images_per_s": [n / s for n, s in zip(shares, hook.last_seconds, strict=True)],
                    "wait_s": max(hook.last_seconds) - min(hook.last_seconds),
                    "top1": top1,
                }
            )
    if rank == 0:
        Path(out).write_text(json.dumps({"shares": shares, "runs": runs}))


def time_knn(cfg: CfgNode, device: str, dim: int, repeats: int = 3) -> float:
    """Median seconds of the kNN alone on random features of the config's full sizes."""
    t = cfg.TEST
    g = torch.Generator().manual_seed(0)
    refs = torch.randn(t.KNN_TRAIN_IMAGES, dim, generator=g).to(device)
    queries = torch.randn(t.KNN_TEST_IMAGES, dim, generator=g).to(device)
    y_ref = torch.randint(0, 1000, (t.KNN_TRAIN_IMAGES,), generator=g)
    y_query = torch.randint(0, 1000, (t.KNN_TEST_IMAGES,), generator=g)
    knn = {"knn": lambda: knn_accuracy(refs, y_ref, queries, y_query, 1000, t.KNN_K, t.KNN_T)}
    return interleaved_timings(knn, repeats=repeats, inner=1, warmup=1)["knn"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--procs", nargs="+", type=int, default=[1])
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--model", nargs="+", default=["none", "backbone"])
    parser.add_argument("--as-rank-of", type=int, default=0, help="one process's share of W")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--knn", action="store_true", help="also time the kNN alone")
    parser.add_argument("--data", help="keep the generated images here (outside the repo)")
    parser.add_argument("--photos", default=str(PHOTOS), help="folder of source photographs")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    config = str(ROOT / args.config) if not os.path.isabs(args.config) else args.config
    cfg = load_config(config, ["MODEL.DEVICE", args.device, "DATASETS.ROOT", "/unused"])
    t = cfg.TEST
    refs, queries = t.KNN_TRAIN_IMAGES, t.KNN_TEST_IMAGES
    if args.as_rank_of:
        refs, queries = max(_shares(cfg, args.as_rank_of), key=sum)
        if not refs or not queries:  # a share of one set: the same images, one batch moved over
            moved = t.KNN_BATCH_SIZE
            refs, queries = (refs - moved, moved) if refs else (moved, queries - moved)
    classes = read_class_list(cfg.DATASETS.CLASS_LIST) if cfg.DATASETS.CLASS_LIST else []
    classes = classes or [f"n{i:08d}" for i in range(100)]
    report: dict = {"config": args.config, "device": args.device, "cpus": os.cpu_count()}
    report.update({"references": refs, "queries": queries, "batch": t.KNN_BATCH_SIZE})
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "imagenet"
        if data.resolve().is_relative_to(ROOT):
            raise SystemExit(f"--data {data}: inside the repository; give a folder outside it")
        start = time.perf_counter()
        if not (data / "train").is_dir():
            report["images"] = make_imagenet_like(data, classes, refs, queries, Path(args.photos))
        print(f"images in {data} ({time.perf_counter() - start:.0f} s)", flush=True)
        base = ["MODEL.DEVICE", args.device, "DATASETS.ROOT", str(data / "train")]
        base += ["TEST.KNN_ROOT", str(data), "TEST.KNN_TRAIN_IMAGES", refs]
        base += ["TEST.KNN_TEST_IMAGES", queries]
        results = report["evaluations"] = []
        for model in args.model:
            for procs in args.procs:
                for workers in args.workers:
                    opts = [str(o) for o in [*base, "DATALOADER.NUM_WORKERS", workers]]
                    out = str(Path(tmp) / "result.json")
                    fn_args = (config, opts, model, args.repeats, out)
                    launch(_evaluate, procs, dist_url="auto", args=fn_args)
                    got = json.loads(Path(out).read_text())
                    row = {"model": model, "procs": procs, "workers": workers, **got}
                    results.append(row)
                    for run in got["runs"]:
                        print(
                            f"model={model} procs={procs} workers/process={workers}: "
                            f"{refs + queries} images in {run['wall_s']:.1f} s; images/s per "
                            f"process {', '.join(f'{v:.0f}' for v in run['images_per_s'])}; "
                            f"wait at the gather {run['wait_s']:.1f} s",
                            flush=True,
                        )
    if args.knn:
        dim = 2048 if cfg.MODEL.ARCH == "resnet50" else 512
        full = load_config(config, ["MODEL.DEVICE", args.device, "DATASETS.ROOT", "/unused"])
        report["knn_s"] = time_knn(full, args.device, dim)
        print(
            f"kNN alone ({full.TEST.KNN_TRAIN_IMAGES} x {full.TEST.KNN_TEST_IMAGES}, d={dim}, "
            f"k={full.TEST.KNN_K}) on {args.device}: {report['knn_s']:.2f} s"
        )
    if args.json:
        write_json(report, args.json)


if __name__ == "__main__":
    main()
