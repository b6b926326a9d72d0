"""Golden runs: six fixed-seed tiny pretraining runs must reproduce their stored values exactly.

What it proves: that the pretraining behaviour of the shipped recipes is unchanged, bit for bit.
Each case runs a shipped config through ``PretrainTrainer`` for a few iterations on the CPU (one
process, one thread, generated data) and compares every value of every line of metrics.json
with ``golden_metrics.json`` using ``==`` (only the wall-time keys of ``TIMING_KEYS`` are left
out), and the final checkpoint's weights, buffers and queues by a sha256 of their bytes, plus a
float64 sum and sum of squares per top-level module to say which part moved. The weights catch
what the log may not: metrics.json's ``total_loss`` is detectron2's median over the iterations
so far, which a change of one iteration's loss can leave alone. A refactoring, a reorganisation
or a speed-up that claims "no change of behaviour" must pass it untouched.

The cases, each config's method settings (views, prior, loss, optimiser, AMP, channels-last) as
shipped; only the scale shrinks (data, batch 8, queue 32, 6 iterations, the IN-100 view sizes):

* ``lorac_demo``: the demo's LORAC (demo_fashion_mnist_r18.yaml), prior on from iteration 0;
* ``mocom_demo``, ``mocov2_demo``: its MoCo-M and MoCo-v2 twins;
* ``lorac_in100_multicrop``: IN-100 LORAC, 3 x 32 + 5 x 24 px multi-crop, laplace prior;
* ``lorac_bs_in100``: IN-100 LORAC-bs (the batch-wise prior);
* ``lorac_demo_beta_warmup``: the demo with its shipped beta warm-up (BETA_INF_EPOCHS 0.5 of
  a 6-iteration epoch): beta = inf at iterations 0-2, beta = 2 at 3-5.

The data are generated here with numpy's PCG64 from fixed seeds (not through ``tests.helpers``,
whose changes must not move these values), and their sha256 is stored too: a mismatch there is
a change of the inputs, not of the code.

The values depend on the torch build and the CPU (bfloat16 autocast uses AMX/AVX512-BF16
kernels where present); the file records both. The stored values come from the CPU named in the
file's ``environment``.

When may the values be regenerated? Only for a deliberate change of behaviour (a fixed bug, a
new default, a changed recipe), stated as such in the commit message, or for a new torch/CPU
(said so too); never to make a refactoring pass. Regenerate with::

    .venv/bin/python -m tests.golden.test_golden_runs --write

(``--case NAME`` regenerates one case; ``--check`` compares without pytest).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import platform
import struct
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pretrain.config.defaults import load_config
from pretrain.engine.trainer import PretrainTrainer

GOLDEN_FILE = Path(__file__).with_name("golden_metrics.json")
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


@dataclass(frozen=True)
class Case:
    """One golden run: a shipped config, its data kind and what it overrides besides COMMON."""

    config: str
    data: str  # "fashion_mnist" (idx files) or "imagefolder"
    opts: dict = field(default_factory=dict)


CASES = {
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
    """sha256 over every tensor's name, dtype, shape and bytes, and per top-level module the
    float64 sum and sum of squares of its values (which part moved, when the sha256 does)."""
    h = hashlib.sha256()
    sums: dict[str, list[float]] = {}
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        v = t.double()
        s = sums.setdefault(name.split(".")[0], [0.0, 0.0])
        s[0] += v.sum().item()
        s[1] += (v * v).sum().item()
    return {"sha256": h.hexdigest(), "sum_and_sum_of_squares": sums}


def run_case(name: str, workdir: Path) -> dict:
    """Train case ``name`` in ``workdir``; its record as stored in the golden file."""
    case = CASES[name]
    writer = write_fashion_mnist if case.data == "fashion_mnist" else write_image_folder
    data = writer(workdir / "data")
    out = workdir / "run"
    opts = {**COMMON, "DATASETS.TYPE": case.data, "DATASETS.ROOT": data, "OUTPUT_DIR": out}
    opts.update(case.opts)
    cfg = load_config(str(CONFIGS / case.config), [str(x) for kv in opts.items() for x in kv])
    with one_thread():
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


def environment() -> dict:
    """The torch build and CPU the values depend on (recorded, shown on a failure, not compared)."""
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
    return {
        "torch": torch.__version__,
        "numpy": np.__version__,
        "cpu": cpu,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        # bfloat16 autocast's kernels differ between CPUs with and without these
        "bfloat16_flags": sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"}),
    }


# -- comparison ---------------------------------------------------------------------------------
def _same(a: object, b: object) -> bool:
    """Exact equality, NaN equal to NaN (a NaN logged in both runs is the same behaviour)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def differences(stored: dict, got: dict, limit: int = 20) -> list[str]:
    """What differs between a stored record and a new one, most telling first."""
    diffs = []
    if stored["data_sha256"] != got["data_sha256"]:
        diffs.append("the generated data changed (this module's inputs, not the code under test)")
    want, have = stored["metrics"], got["metrics"]
    if len(want) != len(have):
        diffs.append(f"metrics.json has {len(have)} lines, {len(want)} stored")
    for i, (w, h) in enumerate(zip(want, have, strict=False)):
        if w.keys() != h.keys():
            diffs.append(
                f"line {i}: keys only stored {sorted(w.keys() - h.keys())}, "
                f"only now {sorted(h.keys() - w.keys())}"
            )
        for k in sorted(w.keys() & h.keys()):
            if not _same(w[k], h[k]):
                diffs.append(f"line {i} (iteration {w.get('iteration')}): {k} {w[k]!r} -> {h[k]!r}")
    if stored["model"]["sha256"] != got["model"]["sha256"]:
        diffs.append("final model sha256 differs")
        ws, hs = stored["model"]["sum_and_sum_of_squares"], got["model"]["sum_and_sum_of_squares"]
        for k in sorted(ws.keys() | hs.keys()):
            if ws.get(k) != hs.get(k):
                diffs.append(f"model {k}: sum, sum of squares {ws.get(k)} -> {hs.get(k)}")
    return diffs[:limit] + ([f"... {len(diffs) - limit} more"] if len(diffs) > limit else [])


def load_golden() -> dict:
    return json.loads(GOLDEN_FILE.read_text())


# -- tests ------------------------------------------------------------------------------------
def test_every_case_is_stored():
    """The stored file holds exactly the cases defined here (none dropped or left unrecorded)."""
    assert sorted(load_golden()["cases"]) == sorted(CASES)


def test_the_warmup_case_records_both_sides_of_the_switch():
    """The warm-up case covers what it claims: beta = inf, then the shipped beta = 2."""
    lines = load_golden()["cases"]["lorac_demo_beta_warmup"]["metrics"]
    betas = [m["beta"] for m in lines if "beta" in m]
    assert betas == [math.inf] * 3 + [2.0] * 3, betas


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_run_is_reproduced_exactly(name, tmp_path):
    """Case ``name`` logs the stored values and ends on the stored weights, bit for bit."""
    golden = load_golden()
    diffs = differences(golden["cases"][name], run_case(name, tmp_path))
    stored, now = golden["environment"], environment()
    where = (
        "same torch and CPU as the stored values"
        if stored == now
        else f"stored on {stored}, run on {now}: the difference may be the environment's"
    )
    assert not diffs, f"{name}: behaviour changed ({where}):\n  " + "\n  ".join(diffs)


# -- regeneration -----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate or check tests/golden's values.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"rewrite {GOLDEN_FILE.name}")
    mode.add_argument("--check", action="store_true", help="compare with the stored values")
    parser.add_argument("--case", nargs="+", choices=sorted(CASES), help="only these cases")
    args = parser.parse_args(argv)
    names = args.case or sorted(CASES)
    golden = load_golden() if GOLDEN_FILE.exists() else {"cases": {}}
    failed = False
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            got = run_case(name, Path(tmp))
        if args.write:
            golden["cases"][name] = got
            print(f"{name}: {len(got['metrics'])} lines, model {got['model']['sha256'][:16]}")
        else:
            diffs = differences(golden["cases"][name], got)
            failed |= bool(diffs)
            print(f"{name}: " + ("ok" if not diffs else "\n  ".join(["DIFFERS", *diffs])))
    if args.write:
        golden = {
            "about": "tests/golden/test_golden_runs.py: regenerate only for a deliberate change "
            "of behaviour, said in the commit (see that module's docstring)",
            "environment": environment(),
            "timing_keys_left_out": sorted(TIMING_KEYS),
            "cases": {k: golden["cases"][k] for k in sorted(golden["cases"]) if k in CASES},
        }
        GOLDEN_FILE.write_text(json.dumps(golden, indent=1, allow_nan=True) + "\n")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
