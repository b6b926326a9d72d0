"""Pretraining throughput against a plain ResNet-50 training step: images/s, TFLOP/s, their ratio.

In one process: the project's training step for each shipped IN-1K config at each ``--batch``
(images per GPU), fed from replayed loader batches with every hook (kNN monitor off), and a plain
torchvision ResNet-50 supervised step (cross-entropy, SGD, batch 256), eager and compiled; the
configs' precision and layout, cudnn.benchmark on CUDA. FLOPs of one step are counted with
``FlopCounterMode`` over the first (eager) iteration; images/s is the median of ``--windows``
windows of ``--iters`` iterations (CUDA events on a GPU) after ``--warmup``; each row's ratio is
its TFLOP/s over the plain eager step's. ``--switch KEY VALUE ...`` measures each config and
batch once more with those overrides (its FLOPs the row before's: the same maths).
docs/performance.md says how to read it; ``--device cpu --tiny`` runs it at toy sizes.

Run: .venv/bin/python -m benchmarks.bench_throughput [--device cuda] [--batch 32 64]
    [--configs C ...] [--opts KEY VALUE ...] [--switch KEY VALUE ...] [--json OUT]
    [--device cpu --tiny --no-compile]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import torchvision
from detectron2.engine import HookBase
from fvcore.common.config import CfgNode
from torch.utils.flop_counter import FlopCounterMode

from common import IN1K_CONFIGS, check_cuda, project_cfg, report_json, train_on_replays
from pretrain.cli.user_errors import exit_on_user_error
from pretrain.engine.trainer import PretrainTrainer

# --tiny: toy sizes for a CPU (a test runs them); 32 and 24 px as the step counter's
TINY = {"batch": [8], "plain_batch": 8, "plain_arch": "resnet18", "plain_size": 32,
        "sizes": (32, 24), "queue_batches": 16, "warmup": 1, "windows": 2, "iters": 1}  # fmt: skip
FULL = {"batch": [32, 64], "plain_batch": 256, "plain_arch": "resnet50", "plain_size": 224,
        "sizes": None, "queue_batches": None, "warmup": 5, "windows": 3, "iters": 20}  # fmt: skip


class Clock:
    """Marks on the device's timeline (CUDA events) or the host's; windows between marks."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def windows(self) -> list[float]:
        """Seconds between consecutive marks (waits for the device first)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1e3 for a, b in itertools.pairwise(self.marks)]
        return [b - a for a, b in itertools.pairwise(self.marks)]


def _figures(flops: int, batch: int, windows: list[float], iters: int) -> dict:
    """What a table row shows, from the FLOPs of one step and the timed windows."""
    seconds = statistics.median(windows) / iters
    return {
        "flops_per_step": flops,
        "gflop_per_image": flops / batch / 1e9,
        "window_seconds": windows,
        "iterations_per_window": iters,
        "seconds_per_iteration": seconds,
        "images_per_second": batch / seconds,
        "tflops": flops / seconds / 1e12,
    }


class Probe(HookBase):
    """Counts the FLOPs of iteration 0 and marks the clock after the iterations ``marks``.

    Registered last: its ``after_step`` follows every other hook's, so a window holds whole
    iterations, hooks included."""

    def __init__(self, clock: Clock, marks: set[int], count: bool = True) -> None:
        self.clock, self.marks, self.count = clock, marks, count
        self.counter = FlopCounterMode(display=False)
        self.counting = False
        self.steps = 0

    def before_step(self) -> None:
        if self.trainer.iter == 0 and self.count:
            self.counter.__enter__()
            self.counting = True

    def after_step(self) -> None:
        self.steps += 1
        if self.trainer.iter == 0:
            self.stop_counting()
        if self.trainer.iter in self.marks:
            self.clock.mark()

    def stop_counting(self) -> None:
        """Leave the counting mode (also when iteration 0 raised: it must not outlive it)."""
        if self.counting:
            self.counting = False
            self.counter.__exit__(None, None, None)


def measure(
    config: str = IN1K_CONFIGS[0],
    device: str = "cuda",
    batch: int = 64,
    iters: int = 20,
    warmup: int = 5,
    sizes: tuple[int, int] | None = None,
    queue: int | None = None,
    *,
    windows: int = 1,
    opts: list[str] | tuple[str, ...] = (),
    flops: int | None = None,
) -> dict:
    """Figures of the project's step: ``windows`` windows of ``iters`` iterations after
    ``warmup`` (at least 1: iteration 0 counts the FLOPs). ``sizes``: large and small view
    sizes; ``queue``: MODEL.QUEUE_SIZE (default: the config's, 65,536 for the shipped configs,
    so that the memory figure is the real one); ``opts``: more KEY VALUE overrides; ``flops``:
    the FLOPs of one step, counted elsewhere (a compiled step's kernels are no aten ops the
    counter sees: its eager twin's count, the same maths)."""
    if warmup < 1 or windows < 1 or iters < 1:
        raise ValueError("warmup, windows and iters must be >= 1")
    total = warmup + windows * iters
    with tempfile.TemporaryDirectory(prefix="bench_throughput_") as tmp:
        cfg = project_cfg(config, device, batch, total, Path(tmp), True, sizes, queue, opts)
        torch.backends.cudnn.benchmark = bool(cfg.CUDNN_BENCHMARK)
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        trainer = PretrainTrainer(cfg)
        clock = Clock(device)
        probe = Probe(clock, {warmup - 1 + k * iters for k in range(windows + 1)}, flops is None)
        trainer.register_hooks([probe])
        try:
            train_on_replays(trainer)
        finally:
            probe.stop_counting()
        del trainer
        _release(device)  # before its OUTPUT_DIR goes
    flops = probe.counter.get_total_flops() if flops is None else flops
    if flops == 0:
        raise RuntimeError(f"{config}: no FLOPs counted in iteration 0 (a replayed graph?)")
    amp = cfg.SOLVER.AMP
    result = {
        "config": config,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "batch_per_process": batch,
        "queue_size": int(cfg.MODEL.QUEUE_SIZE),
        "view_sizes": [cfg.INPUT.LARGE_SIZE] * cfg.INPUT.LARGE_CROPS
        + [cfg.INPUT.SMALL_SIZE] * cfg.INPUT.SMALL_CROPS,
        "amp": amp.PRECISION if amp.ENABLED else "float32",
        "channels_last": bool(cfg.MODEL.CHANNELS_LAST),
        "cudnn_benchmark": bool(cfg.CUDNN_BENCHMARK),
        "opts": [str(o) for o in opts],
        "warmup": warmup,
        "iterations": windows * iters,
        "steps_run": probe.steps,  # the trainer's iterations, the final checkpoint's included
        **_figures(flops, batch, clock.windows(), iters),
    }
    if device == "cuda":
        result["max_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def _release(device: str) -> None:
    """Free the last step's memory before the next one is built (one process measures all)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def measure_plain(
    device: str,
    batch: int = 256,
    arch: str = "resnet50",
    size: int = 224,
    compiled: bool = False,
    amp: str | None = "bfloat16",
    channels_last: bool = True,
    warmup: int = 5,
    windows: int = 3,
    iters: int = 20,
    backend: str = "inductor",
) -> dict:
    """A plain torchvision ``arch`` supervised step (cross-entropy over 1,000 classes, SGD with
    momentum and weight decay) on one fixed random batch already on the device, eager or under
    ``torch.compile`` (the model; backward through AOTAutograd; ``backend``: torch.compile's,
    ``aot_eager`` at toy sizes on a CPU, where inductor's code generation takes minutes).
    ``amp``: autocast dtype (None: float32). Its FLOPs are counted on one eager step (the
    compiled step does the same maths)."""
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = device == "cuda"
    layout = torch.channels_last if channels_last else torch.contiguous_format
    model = torchvision.models.get_model(arch, num_classes=1000).to(device, memory_format=layout)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, size, size, device=device).contiguous(memory_format=layout)
    y = torch.randint(0, 1000, (batch,), device=device)
    dtype = getattr(torch, amp) if amp else None

    def step(net: torch.nn.Module) -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        optimizer.step()

    with FlopCounterMode(display=False) as counter:
        step(model)
    net = torch.compile(model, backend=backend) if compiled else model
    for _ in range(warmup):
        step(net)
    clock = Clock(device)
    clock.mark()
    for _ in range(windows):
        for _ in range(iters):
            step(net)
        clock.mark()
    return {
        "step": f"torchvision {arch}, supervised, {'torch.compile' if compiled else 'eager'}",
        "arch": arch,
        "compiled": compiled,
        "batch_per_process": batch,
        "image_size": size,
        "amp": amp or "float32",
        "channels_last": channels_last,
        "warmup": warmup,
        **_figures(counter.get_total_flops(), batch, clock.windows(), iters),
    }


def ratio_report(
    device: str,
    configs: list[str],
    opts: list[str],
    compile_plain: bool = True,
    tiny: bool = False,
    switch: list[str] | None = None,
    **overrides: Any,
) -> dict:
    """Every step of the table in one process: the plain step (eager, then compiled), then each
    config at each batch; each row's ``ratio`` is its TFLOP/s over the plain eager step's.
    ``switch`` (KEY VALUE pairs, e.g. SOLVER.COMPILE.ENABLED True): each config and batch once
    more with them, its FLOPs the row before's (the same maths). ``overrides``: values of
    :data:`FULL` (or :data:`TINY` with ``tiny``) to change (None: keep)."""
    p = {**(TINY if tiny else FULL), **{k: v for k, v in overrides.items() if v is not None}}
    first = _check_configs(device, configs, opts, p)
    if switch:
        _check_configs(device, configs, [*opts, *switch], p)
    amp = first.SOLVER.AMP.PRECISION if first.SOLVER.AMP.ENABLED else None
    timing = {k: p[k] for k in ("warmup", "windows", "iters")}
    plain = {
        "device": device, "batch": p["plain_batch"], "arch": p["plain_arch"],
        "size": p["plain_size"], "amp": amp, "channels_last": bool(first.MODEL.CHANNELS_LAST),
        **timing,
    }  # fmt: skip
    rows = [measure_plain(**plain)]
    _release(device)
    if compile_plain:  # toy sizes check the path, not inductor's code (minutes on a CPU)
        backend = "aot_eager" if tiny else "inductor"
        rows.append(measure_plain(**plain, compiled=True, backend=backend))
        torch._dynamo.reset()  # its compiled graphs hold memory the next steps need
        _release(device)
    reference = rows[0]["tflops"]
    for config in configs:
        for batch in p["batch"]:
            queue = _queue(batch, p)
            m = measure(config, device, batch, p["iters"], p["warmup"], p["sizes"], queue,
                        windows=p["windows"], opts=opts)  # fmt: skip
            rows.append({"step": Path(config).stem, **m})
            if switch:
                _release(device)
                m = measure(config, device, batch, p["iters"], p["warmup"], p["sizes"], queue,
                            windows=p["windows"], opts=[*opts, *switch],
                            flops=m["flops_per_step"])  # fmt: skip
                rows.append({"step": f"{Path(config).stem} + {' '.join(switch)}", **m})
                torch._dynamo.reset()
            _release(device)
    for row in rows:
        row["ratio"] = row["tflops"] / reference
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "reference": rows[0]["step"],
        "opts": [str(o) for o in opts],
        "switch": [str(o) for o in switch or []],
        "rows": rows,
    }


def _check_configs(device: str, configs: list[str], opts: list[str], p: dict) -> CfgNode:
    """Every config at every batch with every override, before anything is measured: a mistake
    ends the run in one line, not after minutes of measuring. Returns the first one."""
    with tempfile.TemporaryDirectory(prefix="bench_throughput_") as tmp:
        cfgs = [
            project_cfg(c, device, b, 1, Path(tmp), False, p["sizes"], _queue(b, p), opts)
            for c in configs
            for b in p["batch"]
        ]
    return cfgs[0]


def _queue(batch: int, p: dict) -> int | None:
    """MODEL.QUEUE_SIZE: the config's (65,536, the real memory figure) at full size."""
    return p["queue_batches"] * batch if p["queue_batches"] else None


def table(report: dict) -> str:
    """The rows as a Markdown table under a line naming the device, torch and the options."""
    lines = [
        f"device: {report['device']}, torch {report['torch']}"
        + (f", opts: {' '.join(report['opts'])}" if report["opts"] else ""),
        "",
        "| step | images/GPU | img/s | GFLOP/img | TFLOP/s | of the plain eager step |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['step']} | {r['batch_per_process']} | {r['images_per_second']:,.4g} | "
            f"{r['gflop_per_image']:.4g} | {r['tflops']:.4g} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--configs", "--config", nargs="+", default=IN1K_CONFIGS)
    parser.add_argument("--batch", type=int, nargs="+", help="images per GPU (32 64; tiny: 8)")
    parser.add_argument("--opts", nargs="*", default=[], help="KEY VALUE for every config")
    parser.add_argument(
        "--switch", nargs="*", default=[], help="KEY VALUE: each config once more with these"
    )
    parser.add_argument("--plain-batch", type=int, help="the plain step's batch (256; tiny: 8)")
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile plain step")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a CPU test runs them)")
    parser.add_argument("--warmup", type=int, help="untimed iterations (5; tiny: 1)")
    parser.add_argument("--windows", type=int, help="timed windows, median taken (3; tiny: 2)")
    parser.add_argument("--iters", type=int, help="iterations per window (20; tiny: 1)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if len(args.opts) % 2 or len(args.switch) % 2:
        parser.error("--opts and --switch take KEY VALUE pairs")
    check_cuda(parser, args.device)
    report = ratio_report(
        args.device, args.configs, args.opts, not args.no_compile, args.tiny, args.switch,
        batch=args.batch, plain_batch=args.plain_batch, warmup=args.warmup,
        windows=args.windows, iters=args.iters,
    )  # fmt: skip
    report_json(report, args.json)
    print(table(report))


if __name__ == "__main__":
    main()
