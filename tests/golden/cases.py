"""The golden cases: fixed-seed tiny pretraining runs of the shipped recipes, and what is kept of
each (the metrics.json lines, a fingerprint of the final weights) and of the environment that
ran it.

The cases, each config's method settings (views, prior, loss, optimiser, AMP, channels-last) as
shipped; only the scale shrinks (data, batch 8, queue 32, 6 iterations, the IN-100 view sizes):

* ``lorac_demo``: the demo's LORAC (demo_fashion_mnist_r18.yaml), prior on from iteration 0;
* ``mocom_demo``, ``mocov2_demo``: its MoCo-M and MoCo-v2 twins;
* ``lorac_in100_multicrop``: IN-100 LORAC, 3 x 32 + 5 x 24 px multi-crop, laplace prior;
* ``lorac_bs_in100``: IN-100 LORAC-bs (the batch-wise prior);
* ``lorac_demo_beta_warmup``: the demo with its shipped beta warm-up (BETA_INF_EPOCHS 0.5 of
  a 6-iteration epoch): beta = inf at iterations 0-2, beta = 2 at 3-5;
* ``<case>_fp32``: each of these with autocast off (float32 throughout). The shipped recipes run
  bfloat16 autocast, whose CPU kernels differ between CPUs (AMX, AVX512-BF16, emulated) by
  ~0.1-1 % from the first iteration; float32 kernels differ between CPUs only in summation
  order (~1e-7), so these twins guard the arithmetic tightly on any CPU (tests/golden/compare.py).

The data are generated here with numpy's PCG64 from fixed seeds (not through ``tests.helpers``,
whose changes must not move these values), and their sha256 is stored too: a mismatch there is
a change of the inputs, not of the code.

:data:`PLANTS` are three small deliberate changes of behaviour (the temperature, the seed, the
last momentum update left out) that the comparison must catch on any CPU.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import struct
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pretrain.config.defaults import load_config
from pretrain.engine import hooks as engine_hooks
from pretrain.engine.trainer import PretrainTrainer

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "pretrain"

# metrics.json keys that depend on wall time, not on the computation; left out of the comparison.
TIMING_KEYS = frozenset({"time", "data_time", "rank_data_time", "eta_seconds", "images_per_sec"})

ITERATIONS = 6
BATCH = 8
IMAGES = ITERATIONS * BATCH  # one epoch of 6 iterations: BETA_INF_EPOCHS 0.5 -> 3 iterations

# What every case shrinks, whatever its config: one process on the CPU, a few iterations, every
# iteration logged, no checkpoint before the final one, no kNN monitor.
COMMON = {
    "SEED": 0,
    "MODEL.DEVICE": "cpu",
    "DATALOADER.NUM_WORKERS": 0,
    "SOLVER.IMS_PER_BATCH": BATCH,
    "MODEL.QUEUE_SIZE": 4 * BATCH,
    "SOLVER.MAX_ITER": ITERATIONS,
    "SOLVER.LOG_PERIOD": 1,
    "SOLVER.CHECKPOINT_PERIOD": 1000,
    "TEST.KNN_PERIOD": 0,
}
# The IN-100 recipe at a tiny scale: no ImageNet-100 class list (generated folders), views of 32
# and 24 px instead of 224 and 96 (bench_step's sizes; with the shipped bfloat16 autocast the CPU
# refuses ResNet-18 views under 17 px, pretrain.engine.launch.check_cpu_bfloat16).
IN100 = {"DATASETS.CLASS_LIST": "", "INPUT.LARGE_SIZE": 32, "INPUT.SMALL_SIZE": 24}
FP32 = {"SOLVER.AMP.ENABLED": False}
FP32_SUFFIX = "_fp32"

# How many values of each top-level module's final state the fingerprint keeps (evenly spaced
# over its flattened floating tensors): enough for a relative L2 distance that sees a change of
# every weight (the left-out momentum update moves each key-encoder weight by 1 % of q - k).
SAMPLE_SIZE = 256


@dataclass(frozen=True)
class Case:
    """One golden run: a shipped config, its data kind and what it overrides besides COMMON."""

    config: str
    data: str  # "fashion_mnist" (idx files) or "imagefolder"
    opts: dict = field(default_factory=dict)


_SHIPPED = {
    # The prior from iteration 0 (the demo's warm-up is the last case): every logged iteration
    # goes through the nuclear-norm term and its gradient.
    "lorac_demo": Case(
        "demo_fashion_mnist_r18.yaml", "fashion_mnist", {"LOSS.BETA_INF_EPOCHS": 0.0}
    ),
    "mocom_demo": Case("demo_fashion_mnist_r18_mocom.yaml", "fashion_mnist"),
    "mocov2_demo": Case("demo_fashion_mnist_r18_mocov2.yaml", "fashion_mnist"),
    "lorac_in100_multicrop": Case(
        "in100_r18_lorac_beta2.yaml", "imagefolder", {**IN100, "LOSS.BETA_INF_EPOCHS": 0.0}
    ),
    "lorac_bs_in100": Case(
        "in100_r18_lorac_bs.yaml", "imagefolder", {**IN100, "LOSS.BETA_INF_EPOCHS": 0.0}
    ),
    # The demo's shipped warm-up, BETA_INF_EPOCHS 0.5, over a 6-iteration epoch: the prior
    # switches on at iteration 3.
    "lorac_demo_beta_warmup": Case("demo_fashion_mnist_r18.yaml", "fashion_mnist"),
}
CASES = {
    **_SHIPPED,
    **{n + FP32_SUFFIX: Case(c.config, c.data, {**c.opts, **FP32}) for n, c in _SHIPPED.items()},
}


def is_float32_case(name: str) -> bool:
    return name.endswith(FP32_SUFFIX)


# -- planted changes: what the comparison must catch ---------------------------------------------
@contextmanager
def _without_last_momentum_update() -> Iterator[None]:
    """The momentum encoder is not updated after the last iteration (an off-by-one in the hook)."""
    original = engine_hooks.MomentumUpdate.after_step

    def after_step(self: engine_hooks.MomentumUpdate) -> None:
        if self.trainer.iter != self.trainer.max_iter - 1:
            original(self)

    engine_hooks.MomentumUpdate.after_step = after_step
    try:
        yield
    finally:
        engine_hooks.MomentumUpdate.after_step = original


@dataclass(frozen=True)
class Plant:
    opts: dict = field(default_factory=dict)
    patch: object = nullcontext  # a context manager factory active while the case trains


PLANTS = {
    "tau_0.11": Plant({"LOSS.TAU": 0.11}),
    "seed_1": Plant({"SEED": 1}),
    "no_last_momentum_update": Plant(patch=_without_last_momentum_update),
}


# -- data --------------------------------------------------------------------------------------
def _textures(rng: np.random.Generator, n: int, size: int, channels: int) -> np.ndarray:
    """(n, size, size, channels) uint8: a random 4x4 colour layout upsampled plus pixel noise,
    so that instances differ at every crop size."""
    coarse = rng.integers(0, 256, (n, 4, 4, channels))
    up = np.repeat(np.repeat(coarse, size // 4, axis=1), size // 4, axis=2)
    return np.clip(up + rng.integers(-30, 31, up.shape), 0, 255).astype(np.uint8)


def write_fashion_mnist(root: Path) -> Path:
    """IDX files in Fashion-MNIST's layout (28 x 28 grey, labels cycling over 10 classes)."""
    root.mkdir(parents=True)
    images = _textures(np.random.default_rng(1), IMAGES, 28, 1)[..., 0]
    labels = (np.arange(IMAGES) % 10).astype(np.uint8)
    for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
        header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
        data = gzip.compress(header + arr.tobytes(), mtime=0)  # the same bytes on every run
        (root / f"train-{kind}-ubyte.gz").write_bytes(data)
    return root


def write_image_folder(root: Path) -> Path:
    """Two class folders of 40 x 40 RGB PNGs (lossless, so the pixels are the generated ones)."""
    images = _textures(np.random.default_rng(2), IMAGES, 40, 3)
    for i, pixels in enumerate(images):
        folder = root / f"class{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"img{i:02d}.png")
    return root


def data_sha256(root: Path) -> str:
    """sha256 of the dataset's decoded content: relative paths and pixels (or idx bytes)."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(root)).encode())
        if path.suffix == ".gz":
            h.update(gzip.decompress(path.read_bytes()))
        else:
            h.update(np.asarray(Image.open(path)).tobytes())
    return h.hexdigest()


# -- one run -----------------------------------------------------------------------------------
@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread (CPU kernels' reductions depend on the thread count), restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def model_fingerprint(state: dict[str, torch.Tensor]) -> dict:
    """sha256 over every tensor's name, dtype, shape and bytes (the exact comparison); per
    top-level module the float64 sum and sum of squares of its values (which part moved) and
    :data:`SAMPLE_SIZE` evenly spaced values of its floating tensors, flattened in name order
    (the tolerant comparison's relative L2 distance)."""
    h = hashlib.sha256()
    sums: dict[str, list[float]] = {}
    flat: dict[str, list[torch.Tensor]] = {}
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        module = name.split(".")[0]
        v = t.double()
        s = sums.setdefault(module, [0.0, 0.0])
        s[0] += v.sum().item()
        s[1] += (v * v).sum().item()
        if t.is_floating_point():
            flat.setdefault(module, []).append(v.reshape(-1))
    sample = {}
    for module, parts in flat.items():
        v = torch.cat(parts)
        idx = torch.linspace(0, v.numel() - 1, min(SAMPLE_SIZE, v.numel())).round().long()
        sample[module] = [float(x) for x in v[idx].float().tolist()]  # float32 values
    return {"sha256": h.hexdigest(), "sum_and_sum_of_squares": sums, "sample": sample}


def run_case(name: str, workdir: Path, plant: str | None = None) -> dict:
    """Train case ``name`` (with the planted change ``plant``, if any) in ``workdir``; its record
    as stored in the golden file."""
    case = CASES[name]
    writer = write_fashion_mnist if case.data == "fashion_mnist" else write_image_folder
    data = writer(workdir / "data")
    out = workdir / "run"
    changed = PLANTS[plant] if plant else Plant()
    opts = {**COMMON, "DATASETS.TYPE": case.data, "DATASETS.ROOT": data, "OUTPUT_DIR": out}
    opts.update({**case.opts, **changed.opts})
    cfg = load_config(str(CONFIGS / case.config), [str(x) for kv in opts.items() for x in kv])
    with one_thread(), changed.patch():
        trainer = PretrainTrainer(cfg)
        trainer.resume()
        trainer.train()
        del trainer  # releases OUTPUT_DIR's lock and the model
    lines = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    state = torch.load(out / "model_final.pth", map_location="cpu", weights_only=True)["model"]
    return {
        "config": case.config,
        "data_sha256": data_sha256(data),
        "metrics": [{k: v for k, v in m.items() if k not in TIMING_KEYS} for m in lines],
        "model": model_fingerprint(state),
    }


# -- the environment the values depend on -------------------------------------------------------
# Variables that steer the CPU kernels torch picks (oneDNN's ISA, ATen's vector width, MKL's):
# setting one makes another CPU, as far as these kernels can tell.
ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY",
                 "MKL_ENABLE_INSTRUCTIONS", "MKL_DEBUG_CPU_TYPE")  # fmt: skip


def _cpuinfo() -> tuple[str, set[str]]:
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                cpu = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return cpu, flags


def _caches() -> list[str]:
    """cpu0's caches as 'L<level><type> <size>' (oneDNN's blocking, and so the summation order,
    follows the cache sizes: two CPUs of one model name may differ here)."""
    out = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        out.append(f"L{level}{kind[0].lower()} {size}")
    return out


def environment() -> dict:
    """The torch build, CPU and kernel-selecting variables the values depend on. A stored record
    is compared exactly only where every field it holds equals this."""
    cpu, flags = _cpuinfo()
    return {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # bfloat16 autocast's kernels differ between CPUs with and without these
        "bfloat16_flags": sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"}),
        "cpu_flags_sha256": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16],
        "caches": _caches(),
        "isa_variables": {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ},
    }
