"""What makes ``make gpu-quick`` (benchmarks/gpu_quick.py) fail: each check reads one part's
figures and returns what is wrong with them, one line each (none: the part passes).

* a compiled step that adds a graph after its step 1 (one beta phase: a recompile, minutes of
  inductor per step on a GPU) or has a graph break;
* the compiled steps' losses or queue rows outside bfloat16's rounding of the eager step's
  (same data, same steps);
* a world-1 collective whose compiled result differs from the eager one;
* a CUDA-graphs step whose profiled step launches no CUDA graph (judged from the profiler's
  events, whatever the torch version's counters say: torch 2.11's inductor can leave CUDA graphs
  off without a counter or a log).
"""

from __future__ import annotations

LOSS_RTOL = 2e-2  # bfloat16 keeps 8 bits: a loss over a few steps agrees to ~1e-2
QUEUE_MIN_COSINE = 0.98  # a queue row (an L2-normalised key) against its eager twin


def step_failures(part: dict, compiled: bool, cuda_graphs: bool) -> list[str]:
    """A LORAC step part: recompiles after step 1, graph breaks, missing CUDA-graph launches."""
    bad = []
    if compiled and part["graphs_after_step_1"]:
        causes = "; ".join(part["recompile_causes"]) or "cause not reported"
        bad.append(f"{part['graphs_after_step_1']} graph(s) added after step 1: {causes}")
    if compiled and part["graph_breaks"]:
        bad.append(f"graph breaks: {part['graph_breaks']}")
    if cuda_graphs and part["graph_launches"] == 0:
        skips = "; ".join(part["cudagraph_skip_reasons"]) or "no skip reason logged"
        bad.append(f"no CUDA graph launched in the profiled step ({skips})")
    return bad


def equal_failures(part: dict) -> list[str]:
    """The compiled steps against the eager one (``compiled_equals_eager``)."""
    bad = []
    for name, cmp in part.items():
        if not isinstance(cmp, dict):
            continue
        worst = max(cmp["loss_relative_differences"], default=0.0)
        if worst > LOSS_RTOL:
            bad.append(f"{name}: a loss {worst:.2%} off eager's (bfloat16: {LOSS_RTOL:.0%})")
        if cmp["queue_rows_min_cosine"] < QUEUE_MIN_COSINE:
            bad.append(
                f"{name}: a queue row at cosine {cmp['queue_rows_min_cosine']:.4f} to eager's "
                f"(at least {QUEUE_MIN_COSINE})"
            )
    return bad


def collective_failures(part: dict) -> list[str]:
    """A world-1 collective check: its ``differences`` above their ``tolerance``."""
    tol = part["tolerance"]
    diffs = part["differences"].items()
    return [f"{k} differs by {v:.3g} (more than {tol:g})" for k, v in diffs if v > tol]
