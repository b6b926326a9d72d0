"""The GPU check that decides the step in one call (``make gpu-quick``): at most 9 minutes on one
H100 from a fresh machine, one process. Each part is timed, its error caught and written (the
rest still run), and every figure goes to ``--out``/quick.json as soon as it is measured:

1. the plain torchvision ResNet-50 step, eager and compiled (the references of the ratios);
2. IN-1K LORAC at ``--batch`` images per GPU: eager, static, compiled and compiled with CUDA
   graphs ("reduce-overhead"): the first step's time (the compile), per-step wall, host and GPU
   times, recompiles, graph breaks, CUDA-graph skips with their reasons, kernels per step, peak
   memory, TFLOP/s and the ratio to both plain steps (the eager step's FLOPs: the same maths);
3. the compiled step's losses and queue rows against the eager step's over the same steps;
4. world-1 collectives under compile (NCCL; gloo on the CPU): a channels_last all-to-all,
   SyncBN compiled against eager, DDP (static graph) around a compiled model against eager.

inductor's caches go to ``--out``/cache: bring that folder back and a rerun starts warm.
``--device cpu --tiny`` runs every part at toy sizes, 3 steps, with the ``aot_eager`` backend.

Run: python -m benchmarks.gpu_quick --out OUT [--batch 32] [--device cpu --tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

CONFIG = "configs/pretrain/in1k_r50_lorac_200ep.yaml"
STATIC = ["SOLVER.STATIC_STEP", "True"]
VARIANTS = {  # name: overrides of the shipped config
    "eager": [],
    "static": STATIC,
    "compiled": ["SOLVER.COMPILE.ENABLED", "True", "SOLVER.COMPILE.MODE", "default"],
    "cudagraphs": ["SOLVER.COMPILE.ENABLED", "True", "SOLVER.COMPILE.MODE", "reduce-overhead"],
}
STEPS = 5  # the steps whose wall time is kept one by one (the first compiles)
TINY_STEPS = 3


def _run_step_figures(device: str, batch: int, opts: list[str], tiny: bool, steps: int) -> dict:
    """Per-step figures of the project's step over replayed loader batches
    (:func:`benchmarks.common.train_on_replays`), ``steps`` steps, metrics logged every step."""
    import torch
    from detectron2.engine import HookBase
    from torch._dynamo.utils import counters
    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks.common import project_cfg, train_on_replays
    from pretrain.engine.trainer import PretrainTrainer

    cuda = device == "cuda"

    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU

    class Clock(HookBase):
        """Host and GPU time of every step; the FLOPs of step 0 (eager only: a compiled step's
        kernels are no aten ops) and the kernels of the second-to-last step."""

        def __init__(self) -> None:
            self.host: list[float] = []
            self.events: list = []
            self.flops = FlopCounterMode(display=False) if eager else None
            self.kernels = -1

        def before_step(self) -> None:
            if self.trainer.iter == 0 and self.flops is not None:
                self.flops.__enter__()
            if self.trainer.iter == steps - 2:
                self.prof = torch.profiler.profile(activities=[activity])
                self.prof.__enter__()
            self.t0 = time.perf_counter()
            if cuda:
                self.events.append(torch.cuda.Event(enable_timing=True))
                self.events[-1].record()

        def after_step(self) -> None:
            self.host.append(time.perf_counter() - self.t0)
            if self.trainer.iter == 0:
                self.graphs_after_first = counters["stats"]["unique_graphs"]
            if cuda:
                self.events.append(torch.cuda.Event(enable_timing=True))
                self.events[-1].record()
            if self.trainer.iter == 0 and self.flops is not None:
                self.flops.__exit__(None, None, None)
            if self.trainer.iter == steps - 2:
                if cuda:
                    torch.cuda.synchronize()
                self.prof.__exit__(None, None, None)
                ev = self.prof.events()
                self.kernels = sum(1 for e in ev if e.device_type == torch.autograd.DeviceType.CUDA)
                if not cuda:
                    self.kernels = sum(1 for e in ev if e.name.startswith("aten::"))

    counters.clear()
    torch._dynamo.reset()
    skipped = _Messages()  # inductor says why it skips CUDA graphs in a warning of this logger
    torch._logging.set_logs(cudagraphs=True)
    log = torch._logging.getArtifactLogger("torch._inductor.cudagraph_utils", "cudagraphs")
    log.addHandler(skipped)
    toy = {"sizes": (32, 24), "queue": 16 * batch} if tiny else {}
    eager = not opts
    if tiny:
        opts = [*opts, "SOLVER.COMPILE.BACKEND", "aot_eager", "MODEL.ARCH", "resnet18"]
    with tempfile.TemporaryDirectory(prefix="gpu_quick_") as tmp:
        cfg = project_cfg(CONFIG, device, batch, steps, Path(tmp), opts=opts, **toy)
        cfg.defrost()
        cfg.SOLVER.LOG_PERIOD = 1
        cfg.freeze()
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        trainer = PretrainTrainer(cfg)
        clock = Clock()
        trainer.register_hooks([clock])
        train_on_replays(trainer)
        queues = trainer.model.queues.detach().float().cpu()
        losses = [x for x in _metrics(Path(cfg.OUTPUT_DIR)) if "total_loss" in x]
    gpu = []
    if cuda:
        torch.cuda.synchronize()
        gpu = [
            a.elapsed_time(b) / 1e3
            for a, b in zip(clock.events[::2], clock.events[1::2], strict=True)
        ]
    return {
        "opts": opts,
        "first_step_seconds": clock.host[0],
        "step_wall_seconds": clock.host[:STEPS],
        "host_ms_per_step": 1e3 * sum(clock.host[1:]) / max(1, len(clock.host) - 1),
        "gpu_ms_per_step": 1e3 * sum(gpu[1:]) / max(1, len(gpu) - 1) if gpu else None,
        "graphs": counters["stats"]["unique_graphs"],
        # graphs made after the first step that no change of beta phase explains
        "recompiles": counters["stats"]["unique_graphs"]
        - clock.graphs_after_first
        - (_phases(losses) - 1),
        "graph_breaks": dict(counters["graph_break"]),
        "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
        "cudagraph_skip_reasons": skipped.messages,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "kernels_per_step": clock.kernels,
        "flops_per_step": clock.flops.get_total_flops() if clock.flops is not None else None,
        "losses": [x["total_loss"] for x in losses],
        "_queues": queues,
    }


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:500])


def _phases(lines: list[dict]) -> int:
    return len({x.get("beta") for x in lines}) if lines else 1


def _metrics(out: Path) -> list[dict]:
    path = out / "metrics.json"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _equal_numbers(eager: dict, compiled: dict) -> dict:
    """The compiled step against the eager one over the same steps and data."""
    import torch

    ql, qc = eager["_queues"], compiled["_queues"]
    cos = torch.nn.functional.cosine_similarity(ql.flatten(0, 1), qc.flatten(0, 1), dim=-1)
    rel = [abs(c - e) / abs(e) for e, c in zip(eager["losses"], compiled["losses"], strict=True)]
    return {
        "loss_relative_differences": rel,
        "losses_within_bfloat16": all(r < 2e-2 for r in rel),
        "queue_rows_min_cosine": float(cos.min()),
        "queue_rows_in_order": bool(float(cos.min()) > 0.9),
    }


def _collectives(device: str, backend: str) -> dict:
    """World-1 checks of the collectives under torch.compile."""
    import torch
    import torch.distributed as dist

    from pretrain.modeling.norm import SyncBatchNorm

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group(
            "nccl" if device == "cuda" else "gloo",
            init_method=f"file://{tmp}/store",
            rank=0,
            world_size=1,
        )
        try:
            x = torch.randn(8, 4, 6, 6, device=device).contiguous(memory_format=torch.channels_last)

            def exchange(t: torch.Tensor) -> torch.Tensor:
                o = torch.empty_like(t)
                dist.all_to_all_single(o, t)
                return o

            got = torch.compile(exchange, fullgraph=True, backend=backend)(x)
            out["all_to_all_channels_last_equal"] = bool(torch.equal(got, x))
            bn = SyncBatchNorm(4).to(device)
            ref = SyncBatchNorm(4).to(device)
            ref.load_state_dict(bn.state_dict())
            compiled = torch.compile(bn, fullgraph=True, backend=backend)
            for _ in range(3):
                y_c, y_e = compiled(x), ref(x)
            out["syncbn_output_max_diff"] = float((y_c - y_e).abs().max())
            out["syncbn_running_mean_max_diff"] = float(
                (bn.running_mean - ref.running_mean).abs().max()
            )
            out["ddp_compiled_losses"] = _ddp_steps(device, backend)
            out["syncbn_eager_vs_batchnorm"] = _syncbn_eager_cost(device, tiny=device == "cpu")
        finally:
            dist.destroy_process_group()
    return out


def _syncbn_eager_cost(device: str, tiny: bool) -> dict:
    """The eager SyncBN (plain ops, traceable) against torch's fused BatchNorm2d on one
    ResNet-50 activation (bfloat16, channels_last): forward and backward seconds each."""
    import torch

    from pretrain.modeling.norm import SyncBatchNorm

    shape = (4, 8, 8, 8) if tiny else (32, 256, 56, 56)
    x = torch.randn(shape, device=device, dtype=torch.bfloat16, requires_grad=True)
    x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    seconds = {}
    for name, bn in (("syncbn", SyncBatchNorm(shape[1])), ("batchnorm", torch.nn.BatchNorm2d(
            shape[1]))):  # fmt: skip
        bn = bn.to(device)

        def step(bn: torch.nn.Module = bn) -> None:
            with torch.autocast(device, dtype=torch.bfloat16):
                bn(x).float().sum().backward()

        step()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds[name] = (time.perf_counter() - t0) / 20
    return {**seconds, "ratio": seconds["syncbn"] / seconds["batchnorm"]}


def _ddp_steps(device: str, backend: str) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.LazyLinear(4)).to(device)  # fmt: skip
    x, y = torch.randn(4, 3, 8, 8, device=device), torch.randint(0, 4, (4,), device=device)
    net(x)
    eager = torch.nn.Sequential(*[m for m in net])  # the same modules: run eager first
    state = {k: v.clone() for k, v in net.state_dict().items()}
    losses = {}
    for name in ("eager", "ddp_compiled"):
        net.load_state_dict(state)
        model = eager
        if name == "ddp_compiled":
            model = torch.compile(
                DistributedDataParallel(net, static_graph=True, gradient_as_bucket_view=True),
                backend=backend,
            )
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        losses[name] = []
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses[name].append(float(loss))
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder of quick.json and the caches")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--batch", type=int, help="images per GPU (32; tiny: 8)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a CPU test runs them)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str((out / "cache").resolve()))
    import torch

    from benchmarks.bench_throughput import measure_plain
    from benchmarks.common import check_cuda

    check_cuda(parser, args.device)

    batch = args.batch or (8 if args.tiny else 32)
    steps = TINY_STEPS if args.tiny else 8
    backend = "aot_eager" if args.tiny else "inductor"
    report: dict = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "torch": torch.__version__, "batch_per_gpu": batch, "parts": {}}  # fmt: skip
    start = time.perf_counter()

    def part(name: str, fn: Callable[[], dict]) -> dict | None:
        t0 = time.perf_counter()
        try:
            result = fn()
            entry = {k: v for k, v in result.items() if not k.startswith("_")}
        except Exception as e:  # noqa: BLE001 - written down; the other parts still run
            result, entry = None, {"error": f"{type(e).__name__}: {e}",
                                   "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
        entry["part_seconds"] = time.perf_counter() - t0
        report["parts"][name] = entry
        report["elapsed_seconds"] = time.perf_counter() - start
        (out / "quick.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"{name}: {entry.get('error', 'done')} ({entry['part_seconds']:.1f} s)", flush=True)
        return result

    plain = dict(device=args.device, amp="bfloat16", channels_last=True)
    plain.update(
        batch=8, arch="resnet18", size=32, warmup=1, windows=1, iters=1
    ) if args.tiny else plain.update(
        batch=256, arch="resnet50", size=224, warmup=3, windows=2, iters=10
    )
    ref_eager = part("plain_eager", lambda: measure_plain(**plain))
    ref_compiled = part(
        "plain_compiled", lambda: measure_plain(**plain, compiled=True, backend=backend)
    )
    runs = {}
    # toy sizes: CUDA graphs are inductor's (with aot_eager the mode is the "compiled" row's)
    variants = {k: v for k, v in VARIANTS.items() if not (args.tiny and k == "cudagraphs")}
    for name, opts in variants.items():
        runs[name] = part(
            f"lorac_{name}",
            lambda o=opts: _run_step_figures(args.device, batch, o, args.tiny, steps),
        )
        with contextlib.suppress(Exception):
            torch._dynamo.reset()
    if runs.get("eager") and runs.get("compiled"):
        part("compiled_equals_eager", lambda: _equal_numbers(runs["eager"], runs["compiled"]))
    part("collectives_world1", lambda: _collectives(args.device, backend))
    flops = (runs.get("eager") or {}).get("flops_per_step")
    for name, run in runs.items():
        seconds = run and (run["gpu_ms_per_step"] or run["host_ms_per_step"]) / 1e3
        if not (run and flops and seconds):
            continue
        row = report["parts"][f"lorac_{name}"]
        row["tflops"] = flops / seconds / 1e12  # the eager step's FLOPs: the same maths
        for ref_name, ref in (("plain_eager", ref_eager), ("plain_compiled", ref_compiled)):
            if ref:
                row[f"ratio_to_{ref_name}"] = row["tflops"] / ref["tflops"]
    (out / "quick.json").write_text(json.dumps(report, indent=1, default=str))
    failed = sorted(k for k, v in report["parts"].items() if "error" in v)
    print(f"gpu_quick: {len(report['parts'])} parts in {report['elapsed_seconds']:.0f} s, "
          f"failed: {failed or 'none'}; figures in {out / 'quick.json'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
