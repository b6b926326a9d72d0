"""Two costs only a GPU shows: the nuclear norm's host sync per step, and LARS's launches.

* **The norm's sync** (``torch.linalg.eigh``'s error check, docs/performance.md): the IN-1K LORAC
  step (:func:`benchmarks.bench_throughput.measure`) as shipped against the same step with the
  norm replaced by a sync-free stand-in of negligible cost (the Frobenius norm), in alternating
  rounds in one process; the difference of the medians bounds what the exact norm costs.
* **LARS**: the CUDA kernels one ``LARS.step`` launches over ResNet-50's parameters
  (torch.profiler), against the number of parameters.

Run (on a GPU): python -m benchmarks.bench_gpu_costs [--batch 64] [--rounds 3] [--json OUT];
``--device cpu --tiny`` runs both at toy sizes on the CPU.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import pretrain.losses.lorac as lorac
from bench_throughput import measure
from common import report_json
from pretrain.solver.build import LARS


def _frobenius(x: torch.Tensor, method: str = "eigh") -> torch.Tensor:
    """A stand-in for :func:`pretrain.losses.nuclear.nuclear_norm` (same signature)."""
    return torch.linalg.vector_norm(x.float(), dim=(-2, -1))


def norm_sync_cost(
    batch: int, rounds: int, iters: int, device: str = "cuda", warmup: int = 3, **toy
) -> dict:
    """``toy``: more arguments of :func:`benchmarks.bench_throughput.measure` (view sizes, the
    queue) for a toy run."""
    exact, proxy = [], []
    original = lorac.nuclear_norm

    def seconds() -> float:
        m = measure(device=device, batch=batch, iters=iters, warmup=warmup, **toy)
        return m["seconds_per_iteration"]

    for _ in range(rounds):
        exact.append(seconds())
        lorac.nuclear_norm = _frobenius
        try:
            proxy.append(seconds())
        finally:
            lorac.nuclear_norm = original
    e, p = statistics.median(exact), statistics.median(proxy)
    return {
        "batch_per_process": batch,
        "seconds_per_step_exact_norm": exact,
        "seconds_per_step_sync_free_proxy": proxy,
        "median_exact": e,
        "median_proxy": p,
        "cost_per_step_seconds": e - p,
        "cost_fraction_of_step": (e - p) / e,
    }


def lars_kernels(device: str = "cuda", arch: str = "resnet50") -> dict:
    """The kernels (on the CPU: the aten ops) of one LARS step over ``arch``'s parameters."""
    import torchvision

    model = torchvision.models.get_model(arch).to(device)
    params = [p for p in model.parameters()]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = LARS(params, lr=0.1, momentum=0.9, weight_decay=1e-6)
    opt.step()  # the first step creates the buffers
    cuda = device == "cuda"
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        opt.step()
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        kernels = [e for e in prof.events() if e.name.startswith("aten::_foreach")]
    return {"parameters": len(params), "kernels_per_step": len(kernels)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a CPU test runs them)")
    parser.add_argument("--batch", type=int, default=64, help="images per process")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: bench_gpu_costs needs a CUDA device (or --device cpu --tiny)")
    toy = {"sizes": (32, 24), "queue": 16 * args.batch, "warmup": 1} if args.tiny else {}
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "norm_sync": norm_sync_cost(args.batch, args.rounds, args.iters, args.device, **toy),
        "lars": lars_kernels(args.device, "resnet18" if args.tiny else "resnet50"),
    }
    report_json(result, args.json)


if __name__ == "__main__":
    main()
