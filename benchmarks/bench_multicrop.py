"""Multi-crop augmentation throughput per core: ours vs a PIL + torchvision reference.

End to end per image: JPEG decode, every view (3x224 + 5x96, or MoCo-v2's 2x224), colour
jitter / grayscale / blur, float normalised output. The reference is the SwAV / public LORAC
recipe, one view at a time: RandomResizedCrop -> RandomHorizontalFlip -> RandomApply(ColorJitter)
-> RandomGrayscale -> PIL GaussianBlur -> ToTensor -> Normalize. Ours is MultiCropTransform per
image (uint8 views), the loader's stacking, then BatchColorAugment on the batch, here on the
CPU (in training it runs on the GPU, and the workers only pay the "worker part" line).
Candidates run interleaved in one process on one thread. Acceptance: ours >= 1.5x reference.

Run: .venv/bin/python -m benchmarks.bench_multicrop
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image, ImageDraw, ImageFilter

from common import interleaved_timings
from pretrain.data.color import BatchColorAugment, Blur, ColorSpec, Grayscale, Jitter
from pretrain.data.transforms import CropSpec, MultiCropTransform, mocov2_specs, multicrop_specs
from pretrain.utils.constants import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB

NUM_IMAGES = 32


def make_jpegs(folder: Path, n: int = NUM_IMAGES, seed: int = 0) -> list[Path]:
    """``n`` 500x375 JPEGs of smooth colour fields with shapes and grain (photo-like spectra)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        w, h = (500, 375) if i % 4 else (375, 500)  # some portrait images, as in ImageNet
        low = (rng.random((5, 7, 3)) * 255).astype(np.uint8)
        img = Image.fromarray(low).resize((w, h), Image.Resampling.BICUBIC)
        draw = ImageDraw.Draw(img)
        for _ in range(10):
            x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
            x1, y1 = x0 + int(rng.integers(10, 200)), y0 + int(rng.integers(10, 200))
            fill = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=fill)
        arr = np.asarray(img, dtype=np.float32) + rng.normal(0.0, 8.0, (h, w, 3))
        img = Image.fromarray(arr.clip(0, 255).astype(np.uint8)).filter(ImageFilter.SMOOTH)
        path = folder / f"img_{i:03d}.jpg"
        img.save(path, quality=90)
        paths.append(path)
    return paths


def decode(path: Path) -> Image.Image:
    """What an ImageFolder-style dataset does per sample."""
    with Image.open(path) as f:
        return f.convert("RGB")


class _PILBlur:
    """The reference blur: PIL's GaussianBlur(radius=sigma) with probability p (SwAV, MoCo)."""

    def __init__(self, p: float, sigma: tuple[float, float]) -> None:
        self.p, self.sigma = p, sigma

    def __call__(self, img: Image.Image) -> Image.Image:
        if random.random() >= self.p:
            return img
        return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(*self.sigma)))


def reference_views(crops: list[CropSpec], color: ColorSpec) -> list[Callable]:
    """One torchvision Compose per view, as the public SwAV / LORAC code builds them."""
    out = []
    jitter, blur = color.op(Jitter), color.op(Blur)
    for spec in crops:
        view = T.Compose(
            [
                T.RandomResizedCrop(spec.size, scale=spec.scale, ratio=spec.ratio),
                T.RandomHorizontalFlip(p=spec.flip_prob),
                T.RandomApply([T.ColorJitter(*jitter.strengths)], p=jitter.prob),
                T.RandomGrayscale(p=color.op(Grayscale).prob),
                _PILBlur(blur.prob, blur.sigma),
                T.ToTensor(),
                T.Normalize(IMAGENET_MEAN_RGB, IMAGENET_STD_RGB),
            ]
        )
        out.extend([view] * spec.count)
    return out


def bench(name: str, crops: list[CropSpec], color: ColorSpec, paths: list[Path]) -> float:
    """Time every candidate on ``paths``; print ms/image, images/s and ratios. Returns the ratio."""
    ref_views = reference_views(crops, color)
    on_device = MultiCropTransform(crops, color, color_on_device=True)
    in_worker = MultiCropTransform(crops, color, color_on_device=False)
    augment = BatchColorAugment(color)
    color_gen = torch.Generator().manual_seed(1)
    state = {"seed": 0}

    def worker(transform: MultiCropTransform) -> list[torch.Tensor]:
        # Per-sample generators and per-view stacking, as the pretraining loader does.
        samples = []
        for path in paths:
            state["seed"] += 1
            samples.append(transform(decode(path), torch.Generator().manual_seed(state["seed"])))
        return [torch.stack(views) for views in zip(*samples, strict=True)]

    def reference() -> None:
        for path in paths:
            img = decode(path)
            for view in ref_views:
                view(img)

    candidates = {
        "reference": reference,
        "ours": lambda: augment(worker(on_device), color_gen),
        "ours_worker_part": lambda: worker(on_device),
        "ours_color_in_worker": lambda: augment(worker(in_worker), None, apply_color=False),
    }
    # CPU time of this process next to the wall-clock medians: on a shared machine other jobs
    # stretch wall time, while CPU time still measures the work per core.
    cpu = {k: [] for k in candidates}

    def with_cpu_time(key: str, fn: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            t0 = time.process_time()
            fn()
            cpu[key].append(time.process_time() - t0)

        return run

    timed = {k: with_cpu_time(k, fn) for k, fn in candidates.items()}
    wall = interleaved_timings(timed, repeats=7, inner=1, warmup=1)
    cpu = {k: v[1:] for k, v in cpu.items()}  # drop the warm-up call
    n = len(paths)
    print(f"{name} ({n} JPEGs, {on_device.num_views} views/image, 1 thread)")
    widths = {"wall ms/img": 11, "images/s": 9, "ratio": 6, "cpu ms/img": 11, "cpu ratio": 9}
    print("  " + " " * 22 + "".join(f"{h:>{w + 1}s}" for h, w in widths.items()))
    ref_wall, ref_cpu = wall["reference"], statistics.median(cpu["reference"])
    for k in candidates:
        w, c = wall[k], statistics.median(cpu[k])
        print(
            f"  {k:22s} {w / n * 1e3:11.2f} {n / w:9.1f} {ref_wall / w:5.2f}x"
            f" {c / n * 1e3:11.2f} {ref_cpu / c:8.2f}x"
        )
    return ref_wall / wall["ours"]


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help
    torch.set_num_threads(1)
    random.seed(0)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_jpegs(Path(tmp))
        ratio = bench("multi-crop 3x224 + 5x96", *multicrop_specs(), paths)
        print(f"multi-crop speedup (ours / reference images/s): {ratio:.2f}x (target >= 1.5x)")
        ratio = bench("MoCo-v2 2x224", *mocov2_specs(), paths)
        print(f"MoCo-v2 speedup (ours / reference images/s): {ratio:.2f}x")


if __name__ == "__main__":
    main()
