"""The GPU check that decides the step in one call (``make gpu-quick``): one process, within
``--budget`` seconds (540 on a GPU), every part's figures printed and written to
``--out``/quick.json as it ends, in the order that decides first:

1. ``plain_eager``: the plain torchvision ResNet-50 step, eager (the reference of the ratios);
2. ``lorac_eager``, ``lorac_compiled``, ``lorac_cudagraphs``: IN-1K LORAC at ``--batch`` images
   per GPU, eager, compiled (mode ``default``) and compiled with CUDA graphs
   (``reduce-overhead``): ms per step (the median of the steady-state steps, with its spread),
   TFLOP/s (the eager step's FLOPs: the same maths), the ratio to the plain steps, the compile
   seconds, graphs added after step 1 with their causes, graph breaks, CUDA-graph launches and
   kernels in the profiled step, CUDA-graph skips with their reasons, peak memory;
3. ``compiled_equals_eager``: the compiled steps' losses and queue rows against the eager step's;
4. ``plain_compiled`` (its ratios are then added to the LORAC parts), ``lorac_static``, and
   world-1 collectives under compile: the project's all-to-all of a channels_last batch, SyncBN
   compiled against eager, DDP (static graph) around a compiled model against eager.

Each step part trains the real trainer on replayed loader batches: warm-up steps (the compile),
then the timed steps, then one profiled step, then the last iteration, which logs and writes
``model_final``: nothing in a timed step saves, logs or reads the device. A part that raises
writes its error and the rest still run; before each part the deadline is checked and a part
that would not fit is recorded as skipped. The exit status is 1 when a part failed or a check of
benchmarks/quick_checks.py did (a recompile, a graph break, a loss or queue row off eager's, a
collective difference, a CUDA-graphs step that launches no graph), else 0.

inductor's caches go to ``--out``/cache (bring the folder back: a rerun starts warm) and it
compiles with one thread per core. ``--device cpu --tiny`` runs every part at toy sizes with the
``aot_eager`` backend and the GPU's paths (colour ops in one pass per resolution, the Jacobi
norm). CUDA graphs cannot run there: ``lorac_cudagraphs`` runs its config (mode
``reduce-overhead``, which ``aot_eager`` ignores), the compiled step through every step, the
profile and the launch count, and its graph-launch check is left to a GPU unless
``--require-graph-launch``; ``lorac_compiled`` is not run (the same compiled step).
``--parts`` runs some parts only (a rerun of one that failed, in a short GPU window).

Run: python -m benchmarks.gpu_quick --out OUT [--batch 32] [--budget 540] [--parts P ...]
    [--device cpu --tiny [--require-graph-launch]]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging.handlers
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import quick_checks

CONFIG = "configs/pretrain/in1k_r50_lorac_200ep.yaml"
VARIANTS = {  # name: overrides of the shipped config
    "eager": [],
    "compiled": ["SOLVER.COMPILE.ENABLED", "True", "SOLVER.COMPILE.MODE", "default"],
    "cudagraphs": ["SOLVER.COMPILE.ENABLED", "True", "SOLVER.COMPILE.MODE", "reduce-overhead"],
    "static": ["SOLVER.STATIC_STEP", "True"],
}
COMPILED = ("compiled", "cudagraphs")
# (warm-up, timed) steps; then one profiled step and the last one (it logs and saves)
STEPS = {"full": (3, 20), "tiny": (1, 1)}
# the least time a part takes on a GPU (a guess: no GPU has run it yet); it is skipped when the
# budget left is shorter. None on a CPU toy run: a part is skipped only past the deadline.
MIN_SECONDS = {"plain_eager": 15, "lorac_eager": 20, "lorac_compiled": 90,
               "lorac_cudagraphs": 90, "plain_compiled": 60, "lorac_static": 20}  # fmt: skip
# in the order they run
PARTS = ("plain_eager", "lorac_eager", "lorac_compiled", "lorac_cudagraphs",
         "compiled_equals_eager", "plain_compiled", "lorac_static", "collectives_world1_all_to_all",
         "collectives_world1_syncbn", "collectives_world1_ddp")  # fmt: skip
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")  # the runtime calls that replay a graph


def _steps_hook(cuda: bool, count_flops: bool, profiled: int):  # noqa: ANN202 - a HookBase
    """A trainer hook (registered last: its ``after_step`` follows the checkpointer's and the
    writers'): bench_throughput's probe marking the clock before step 0 and after every step
    (CUDA events on a GPU, else the host clock) and counting the FLOPs of step 0
    (``count_flops``), the graphs dynamo made by the end of step 1, and a profile of step
    ``profiled`` alone. (Built here: detectron2 and torch are imported after the environment of
    inductor is set.)"""
    import torch

    from bench_throughput import Clock, Probe
    from pretrain.engine.recompiles import compiled_graphs

    class Steps(Probe):
        def __init__(self) -> None:
            super().__init__(Clock("cuda" if cuda else "cpu"), range(1 << 62), count_flops)
            self.graphs_after_step_1 = 0
            self.kernels = self.graph_launches = -1

        def before_step(self) -> None:
            it = self.trainer.iter
            if it == 0:
                self.clock.mark()
            super().before_step()
            if it == profiled:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if cuda:
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                self.prof = torch.profiler.profile(activities=activities)
                self.prof.__enter__()

        def after_step(self) -> None:
            it = self.trainer.iter
            if it == profiled:
                if cuda:
                    torch.cuda.synchronize()
                self.prof.__exit__(None, None, None)
                ev = self.prof.events()
                kernel = torch.autograd.DeviceType.CUDA
                self.kernels = sum(
                    1 for e in ev if (e.device_type == kernel if cuda else e.name[:6] == "aten::")
                )
                self.graph_launches = sum(1 for e in ev if e.name in GRAPH_LAUNCHES)
            super().after_step()  # after the profiler's exit: the next step starts here
            if it == 1:
                self.graphs_after_step_1 = compiled_graphs()

    return Steps()


def step_part(
    device: str, batch: int, variant: str, tiny: bool, flops: int | None, hooks: Sequence = ()
) -> dict:
    """One LORAC variant's figures (see the module docstring) over replayed loader batches;
    ``hooks``: more trainer hooks (a test plants a fault with one)."""
    import torch
    from torch._dynamo.utils import counters

    from common import project_cfg, train_on_replays
    from pretrain.engine.recompiles import RecompileWatch, compiled_graphs
    from pretrain.engine.trainer import PretrainTrainer

    cuda = device == "cuda"
    warmup, timed = STEPS["tiny" if tiny else "full"]
    profiled = warmup + timed
    opts = list(VARIANTS[variant])
    toy = {}
    if tiny:  # the GPU's paths on the CPU: the Jacobi norm (colour ops: one_pass below)
        opts += ["SOLVER.COMPILE.BACKEND", "aot_eager", "MODEL.ARCH", "resnet18",
                 "LOSS.NUCLEAR_NORM", "jacobi"]  # fmt: skip
        toy = {"sizes": (32, 24), "queue": 16 * batch}
    counters.clear()
    torch._dynamo.reset()
    # inductor says why it skips CUDA graphs in a warning of this logger
    skipped = logging.handlers.BufferingHandler(capacity=1 << 20)
    skipped.setLevel(logging.WARNING)
    torch._logging.set_logs(cudagraphs=True)
    log = torch._logging.getArtifactLogger("torch._inductor.cudagraph_utils", "cudagraphs")
    log.addHandler(skipped)
    # FLOPs counted on an eager step only (the counter's dispatch mode stops dynamo)
    steps = _steps_hook(cuda, flops is None and variant not in COMPILED, profiled)
    causes: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="gpu_quick_") as tmp:
            cfg = project_cfg(CONFIG, device, batch, profiled + 1, Path(tmp), opts=opts, **toy)
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            trainer = PretrainTrainer(cfg)
            trainer.color_augment.one_pass = True  # a GPU's default; the CPU's is by chunks
            trainer.register_hooks([steps, *hooks])
            with RecompileWatch(lambda c: causes.append(f"iteration {steps.trainer.iter}: {c}")):
                train_on_replays(trainer)
            history = trainer.storage.history("total_loss").values()
            losses = [v for v, _ in sorted(history, key=lambda x: x[1])]
            queues = trainer.model.queues.detach().float().cpu()
            graphs = compiled_graphs()
            breaks = dict(counters["graph_break"])
            cudagraph_skips = counters["inductor"]["cudagraph_skips"]
            del trainer
            torch._dynamo.reset()  # its graphs (and CUDA-graph pools) hold memory the next needs
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    finally:
        log.removeHandler(skipped)
        torch._logging.set_logs()
    seconds = steps.clock.windows()  # every step's, mark to mark (device time on a GPU)
    timed_s = seconds[warmup:profiled]
    ms = statistics.median(timed_s) * 1e3
    flops = steps.counter.get_total_flops() if steps.count else flops
    return {
        "opts": opts,
        "steps": {"warmup": warmup, "timed": timed, "profiled": 1, "last_logs_and_saves": 1},
        "ms_per_step": ms,
        "ms_per_step_spread": [min(timed_s) * 1e3, max(timed_s) * 1e3],
        "step_seconds": seconds,  # every step, the warm-up, profiled and last ones included
        "compile_seconds": seconds[0] - ms / 1e3,  # the first step beyond a steady one
        "flops_per_step": flops,
        "tflops": flops / (ms / 1e3) / 1e12 if flops else None,
        "graphs": graphs,
        "graphs_after_step_1": graphs - steps.graphs_after_step_1,
        "recompile_causes": causes,
        "graph_breaks": breaks,
        "graph_launches": steps.graph_launches,
        "kernels_per_step": steps.kernels,  # CUDA kernels (a CPU: aten ops) in the profiled step
        "cudagraph_skips": cudagraph_skips,
        "cudagraph_skip_reasons": [r.getMessage()[:500] for r in skipped.buffer],
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "losses": losses,
        "_queues": queues,
    }


def _equal_numbers(eager: dict, other: dict) -> dict:
    """A compiled step against the eager one over the same steps and data."""
    import torch

    ql, qc = eager["_queues"], other["_queues"]
    cos = torch.nn.functional.cosine_similarity(ql.flatten(0, 1), qc.flatten(0, 1), dim=-1)
    rel = [abs(c - e) / abs(e) for e, c in zip(eager["losses"], other["losses"], strict=True)]
    return {"loss_relative_differences": rel, "queue_rows_min_cosine": float(cos.min())}


def _exchange(device: str, backend: str) -> dict:
    """The project's all-to-all of a channels_last batch (its rows, as ShuffleBN sends them),
    compiled, against the batch."""
    import torch
    import torch.distributed as dist

    from pretrain.modeling.distributed import as_rows, rows_as

    x = torch.randn(8, 4, 6, 6, device=device).contiguous(memory_format=torch.channels_last)

    def exchange(t: torch.Tensor) -> torch.Tensor:
        rows = as_rows(t)
        out = torch.empty_like(rows)
        dist.all_to_all_single(out, rows)
        return rows_as(out, t)

    got = torch.compile(exchange, fullgraph=True, backend=backend)(x)
    layout = got.is_contiguous(memory_format=torch.channels_last)
    return {"differences": {"all_to_all": float((got - x).abs().max()),
                            "all_to_all_layout": float(not layout)}, "tolerance": 0.0}  # fmt: skip


def _syncbn(device: str, backend: str) -> dict:
    """SyncBN compiled whole against eager, three training steps: outputs, running mean, the
    input's and the weight's gradients."""
    import torch

    from pretrain.modeling.norm import SyncBatchNorm

    torch.manual_seed(0)
    x = torch.randn(8, 4, 6, 6, device=device).contiguous(memory_format=torch.channels_last)
    bn = SyncBatchNorm(4).to(device)
    ref = SyncBatchNorm(4).to(device)
    ref.load_state_dict(bn.state_dict())
    compiled = torch.compile(bn, fullgraph=True, backend=backend)
    grads = {}
    for name, module in (("compiled", compiled), ("eager", ref)):
        for _ in range(3):
            xg = x.detach().requires_grad_()
            y = module(xg)
            y.square().sum().backward()
        grads[name] = (y.detach(), xg.grad)
    (y_c, dx_c), (y_e, dx_e) = grads["compiled"], grads["eager"]
    return {
        "differences": {
            "syncbn_output": float((y_c - y_e).abs().max()),
            "syncbn_input_grad": float((dx_c - dx_e).abs().max()),
            "syncbn_weight_grad": float((bn.weight.grad - ref.weight.grad).abs().max()),
            "syncbn_running_mean": float((bn.running_mean - ref.running_mean).abs().max()),
        },
        "tolerance": 1e-4 if device == "cuda" else 1e-5,
        "eager_cost": _syncbn_eager_cost(device, tiny=device == "cpu"),
    }


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


def _ddp(device: str, backend: str) -> dict:
    """DDP (static graph) around a compiled model against the eager model, five SGD steps."""
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
    rel = max(abs(c - e) / abs(e) for e, c in zip(*losses.values(), strict=True))
    return {"differences": {"ddp_compiled_losses": rel}, "losses": losses,
            "tolerance": 1e-4 if device == "cuda" else 1e-5}  # fmt: skip


def world1(device: str, fn: Callable[[], dict]) -> dict:
    """``fn`` inside a process group of one (NCCL on a GPU, gloo on the CPU)."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as tmp:
        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            return fn()
        finally:
            dist.destroy_process_group()


@dataclass(frozen=True)
class Measures:
    """Where :func:`main` takes its figures from (a test plants its own): the plain step (None:
    bench_throughput's ``measure_plain``), a LORAC variant's, the world-1 collectives'."""

    plain: Callable[..., dict] | None = None
    step: Callable[..., dict] = step_part
    world1: Callable[[str, Callable[[], dict]], dict] = world1


class QuickReport:
    """The parts run one by one against a deadline, each written to ``out``/quick.json and
    printed as it ends; ``failures`` collects what fails (a raised part, a failed check)."""

    def __init__(
        self,
        out: Path,
        budget: float,
        header: dict,
        min_seconds: dict | None = None,
        not_run: dict[str, str] | None = None,
    ) -> None:
        self.out, self.budget, self.min_seconds = out, budget, min_seconds or {}
        self.not_run = not_run or {}  # part: why it is not run (recorded as skipped)
        self.start = time.perf_counter()
        self.report = {**header, "budget_seconds": budget, "parts": {}, "failures": []}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def write(self) -> None:
        self.report["elapsed_seconds"] = self.elapsed()
        path = self.out / "quick.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.report, indent=1, default=str))
        tmp.replace(path)  # a reader (or a kill) never sees half a file

    def part(
        self,
        name: str,
        fn: Callable[[], dict],
        check: Callable[[dict], list[str]] | None = None,
        summary: Callable[[dict], str] | None = None,
    ) -> dict | None:
        """Run ``fn`` unless the deadline would pass first; write and print its figures, and
        its ``check``'s failures. Returns ``fn``'s result (None: skipped or raised)."""
        left = self.budget - self.elapsed()
        need = self.min_seconds.get(name, 0)
        why = self.not_run.get(name)
        if why is None and left <= need:
            why = f"{left:.0f} s of the {self.budget:.0f} s budget left, at least {need} s needed"
        if why is not None:
            entry = {"skipped": why}
            self.report["parts"][name] = entry
            self.write()
            print(f"{name}: skipped ({entry['skipped']})", flush=True)
            return None
        t0 = time.perf_counter()
        try:
            result = fn()
            entry = {k: v for k, v in result.items() if not k.startswith("_")}
            bad = check(entry) if check else []
        except Exception as e:  # noqa: BLE001 - written down; the other parts still run
            result, bad = None, [f"{type(e).__name__}: {e}"]
            entry = {"error": bad[0], "traceback": traceback.format_exc()[-4000:]}
        entry["part_seconds"] = time.perf_counter() - t0
        if bad:
            entry["check_failures"] = bad
            self.report["failures"] += [f"{name}: {b}" for b in bad]
        self.report["parts"][name] = entry
        self.write()
        said = summary(entry) if summary and result is not None else "done"
        print(f"{name}: {said} ({entry['part_seconds']:.1f} s)"
              + "".join(f"\n  FAILED: {b}" for b in bad), flush=True)  # fmt: skip
        return result


def _ratios(row: dict, refs: dict) -> None:
    """TFLOP/s of ``row`` over each measured plain step's."""
    for ref_name, ref in refs.items():
        if ref and row.get("tflops"):
            row[f"ratio_to_{ref_name}"] = row["tflops"] / ref["tflops"]


def _say_step(row: dict) -> str:
    lo, hi = row["ms_per_step_spread"]
    tflops = f"{row['tflops']:.3g} TFLOP/s" if row.get("tflops") else "TFLOP/s unknown"
    ratios = ", ".join(f"{v:.2f}x {k[9:]}" for k, v in row.items() if k.startswith("ratio_to_"))
    return (f"{row['ms_per_step']:.1f} ms/step ({lo:.1f}-{hi:.1f}), {tflops}"
            f"{', ' + ratios if ratios else ''}; compile {row['compile_seconds']:.1f} s, "
            f"{row['graphs_after_step_1']} graphs after step 1, "
            f"{sum(row['graph_breaks'].values())} graph breaks, "
            f"{row['graph_launches']} graph launches")  # fmt: skip


def _say_plain(row: dict) -> str:
    return f"{row['seconds_per_iteration'] * 1e3:.1f} ms/step, {row['tflops']:.3g} TFLOP/s"


def main(argv: list[str] | None = None, measures: Measures | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder of quick.json and the caches")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--batch", type=int, help="images per GPU (32; tiny: 8)")
    parser.add_argument("--budget", type=float, help="seconds for all parts (540; tiny: none)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a CPU test runs them)")
    parser.add_argument("--parts", nargs="+", metavar="PART", help="run only these parts")
    parser.add_argument(
        "--require-graph-launch",
        action="store_true",
        help="fail a CUDA-graphs step without a graph launch on a CPU too (always on a GPU)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.parts or ()) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)} (the parts: {', '.join(PARTS)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str((out / "cache").resolve()))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(cores))
    import torch

    from bench_throughput import measure_plain
    from common import check_cuda

    measures = measures or Measures()
    measure_plain = measures.plain or measure_plain

    check_cuda(parser, args.device)
    torch._inductor.config.compile_threads = int(os.environ["TORCHINDUCTOR_COMPILE_THREADS"])
    cuda = args.device == "cuda"
    batch = args.batch or (8 if args.tiny else 32)
    backend = "aot_eager" if args.tiny else "inductor"
    budget = args.budget if args.budget is not None else (float("inf") if args.tiny else 540.0)
    header = {"device": torch.cuda.get_device_name() if cuda else "cpu",
              "torch": torch.__version__, "batch_per_gpu": batch,
              "compile_threads": torch._inductor.config.compile_threads}  # fmt: skip
    # the comparison runs wherever the steps it compares ran
    asked = set(args.parts or PARTS) | {"compiled_equals_eager"}
    not_run = {p: "not in --parts" for p in PARTS if p not in asked}
    if args.tiny and "lorac_cudagraphs" not in not_run:
        # aot_eager ignores SOLVER.COMPILE.MODE: the two would compile and run the same step
        not_run.setdefault("lorac_compiled", "toy size: lorac_cudagraphs runs its step (aot_eager)")
    q = QuickReport(out, budget, header, None if args.tiny else MIN_SECONDS, not_run)

    plain = dict(device=args.device, amp="bfloat16", channels_last=True)
    plain.update(
        batch=8, arch="resnet18", size=32, warmup=1, windows=1, iters=1
    ) if args.tiny else plain.update(
        batch=256, arch="resnet50", size=224, warmup=3, windows=2, iters=10
    )
    refs: dict = {"plain_eager": q.part("plain_eager", lambda: measure_plain(**plain),
                                        summary=_say_plain)}  # fmt: skip
    runs: dict = {}
    flops = None
    graph_launch_required = cuda or args.require_graph_launch

    def run(variant: str, flops: int | None) -> dict:
        row = measures.step(args.device, batch, variant, args.tiny, flops)
        _ratios(row, refs)
        return row

    for variant in ("eager", "compiled", "cudagraphs"):

        def check(row: dict, v: str = variant) -> list[str]:
            graphs = v == "cudagraphs" and graph_launch_required
            return quick_checks.step_failures(row, v in COMPILED, graphs)

        part = lambda v=variant, f=flops: run(v, f)
        runs[variant] = q.part(f"lorac_{variant}", part, check, _say_step)
        if variant == "eager" and runs["eager"]:
            flops = runs["eager"]["flops_per_step"]
    if runs["eager"] and any(runs.get(v) for v in COMPILED):
        q.part(
            "compiled_equals_eager",
            lambda: {v: _equal_numbers(runs["eager"], runs[v]) for v in COMPILED if runs.get(v)},
            quick_checks.equal_failures,
        )
    refs["plain_compiled"] = q.part(
        "plain_compiled", lambda: measure_plain(**plain, compiled=True, backend=backend),
        summary=_say_plain,
    )  # fmt: skip
    torch._dynamo.reset()
    if refs["plain_compiled"]:  # the ratios of the parts before, now that it is measured
        for variant in runs:
            row = q.report["parts"].get(f"lorac_{variant}", {})
            if "tflops" in row:
                _ratios(row, {"plain_compiled": refs["plain_compiled"]})
        q.write()
    static_failures = lambda r: quick_checks.step_failures(r, False, False)
    q.part("lorac_static", lambda: run("static", flops), static_failures, _say_step)
    for name, fn in (("all_to_all", _exchange), ("syncbn", _syncbn), ("ddp", _ddp)):
        q.part(
            f"collectives_world1_{name}",
            lambda fn=fn: measures.world1(args.device, lambda: fn(args.device, backend)),
            quick_checks.collective_failures,
        )
    failures = q.report["failures"]
    skipped = sorted(k for k, v in q.report["parts"].items() if "skipped" in v)
    print(f"gpu_quick: {len(q.report['parts'])} parts in {q.elapsed():.0f} s, skipped: "
          f"{skipped or 'none'}, failed: {len(failures) or 'none'}; figures in "
          f"{out / 'quick.json'}" + "".join(f"\n  {f}" for f in failures))  # fmt: skip
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
