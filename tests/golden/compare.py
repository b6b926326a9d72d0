"""How a golden run is compared with its stored record: exactly, or within the measured spread.

*Exact* (where the environment matches a stored record: same torch, CPU and kernel-selecting
variables, :func:`tests.golden.cases.environment`): every value of every metrics.json line with
``==`` (NaN equal to NaN) and the final weights by sha256. Any change of behaviour, however
small, fails.

*Within the spread* (any other CPU or torch): the values computed on the host from Python
numbers (:data:`EXACT_KEYS`: iteration, lr, beta, skipped files) and the data's sha256 still
exactly; every other logged value within a relative tolerance per (case, key, iteration), and
each module's final weights within a relative L2 distance of their stored sample. The tolerances
are :data:`FACTOR` times the spread measured between the reference record and the same case run
on other CPUs (the stored records of other machines, and this machine with its kernels limited
to other instruction sets: :data:`EMULATED_CPUS`), with a floor. ``golden_metrics.json`` holds
the spread and the tolerances derived from it; ``test_tolerances_follow_the_recorded_spread``
checks that nobody widened one by hand.

Why that is still a guard: a different CPU rounds differently (float32: the summation order;
bfloat16: the kernels themselves), a change of behaviour changes the arithmetic. The float32
cases' spread is ~1e-7 to 1e-4 where the planted changes move values by 1e-4 to 1e-1
(``test_planted_change_is_caught``); the bfloat16 cases' spread is ~1e-3 to 1e-2 (their
tolerances catch gross changes; the float32 twins catch the small ones).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "EMULATED_CPUS",
    "EXACT_KEYS",
    "FACTOR",
    "NOISY_KEYS",
    "exact_differences",
    "measure_spread",
    "tolerance_from_spread",
    "tolerant_differences",
]

# Logged values computed on the host from Python numbers: the same on every CPU.
EXACT_KEYS = frozenset({"iteration", "lr", "beta", "data/skipped_files"})
# The share of (query, instance) pairs whose positive beats every negative: a count over ~100
# comparisons that a rounding difference flips one at a time (0.098 -> 0.080 between two CPUs
# at iteration 1); its inputs (the loss's logits) are compared through total_loss.
NOISY_KEYS = frozenset({"inst_acc"})
# tolerance = FACTOR x the largest spread measured, never below the floor (a value equal on every
# CPU measured may still round differently on another)
FACTOR = 8.0
FLOOR = {"metrics": 1e-6, "model": 1e-7}

# This machine's kernels limited to what other CPUs offer (the variables oneDNN and ATen read
# when they pick kernels): AVX512-BF16 without AMX (an AMD EPYC Zen 4), AVX512 without BF16, AVX2
# (most CPUs before 2017 and AMD before Zen 4), and ATen's own vector kernels at AVX2 and at none.
EMULATED_CPUS = (
    {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
    {"ATEN_CPU_CAPABILITY": "default"},
)


def _same(a: object, b: object) -> bool:
    """Exact equality, NaN equal to NaN (a NaN logged in both runs is the same behaviour)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def relative(a: float, b: float) -> float:
    """|a - b| relative to the larger magnitude (0 for two zeros or two NaNs; inf for one NaN)."""
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


def sample_distance(a: list[float], b: list[float]) -> float:
    """Relative L2 distance of two weight samples (inf when their lengths differ or one has NaN
    where the other does not)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or not np.array_equal(np.isnan(x), np.isnan(y)):
        return math.inf
    ok = ~np.isnan(x)
    x, y = x[ok], y[ok]
    scale = max(np.linalg.norm(x), np.linalg.norm(y))
    return 0.0 if scale == 0 else float(np.linalg.norm(x - y) / scale)


def _limit(diffs: list[str], limit: int) -> list[str]:
    return diffs[:limit] + ([f"... {len(diffs) - limit} more"] if len(diffs) > limit else [])


def _structure_differences(stored: dict, got: dict) -> list[str]:
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
    return diffs


def exact_differences(stored: dict, got: dict, limit: int = 20) -> list[str]:
    """What differs, bit for bit, between a stored record and a new one, most telling first."""
    diffs = _structure_differences(stored, got)
    for i, (w, h) in enumerate(zip(stored["metrics"], got["metrics"], strict=False)):
        for k in sorted(w.keys() & h.keys()):
            if not _same(w[k], h[k]):
                diffs.append(f"line {i} (iteration {w.get('iteration')}): {k} {w[k]!r} -> {h[k]!r}")
    if stored["model"]["sha256"] != got["model"]["sha256"]:
        diffs.append("final model sha256 differs")
        ws, hs = stored["model"]["sum_and_sum_of_squares"], got["model"]["sum_and_sum_of_squares"]
        for k in sorted(ws.keys() | hs.keys()):
            if ws.get(k) != hs.get(k):
                diffs.append(f"model {k}: sum, sum of squares {ws.get(k)} -> {hs.get(k)}")
    return _limit(diffs, limit)


def tolerant_differences(stored: dict, got: dict, tolerance: dict, limit: int = 20) -> list[str]:
    """What differs by more than ``tolerance`` (one case's entry of the golden file's
    ``tolerance``: ``{"metrics": {key: [per line]}, "model": {module: distance}}``)."""
    diffs = _structure_differences(stored, got)
    tol_metrics, tol_model = tolerance["metrics"], tolerance["model"]
    for i, (w, h) in enumerate(zip(stored["metrics"], got["metrics"], strict=False)):
        for k in sorted(w.keys() & h.keys()):
            where = f"line {i} (iteration {w.get('iteration')}): {k} {w[k]!r} -> {h[k]!r}"
            if k in EXACT_KEYS or not isinstance(w[k], float) or not isinstance(h[k], float):
                if not _same(w[k], h[k]):
                    diffs.append(where + " (computed on the host: equal on every CPU)")
            elif k not in NOISY_KEYS:
                allowed = tol_metrics.get(k, [FLOOR["metrics"]] * (i + 1))[i]
                r = relative(w[k], h[k])
                if r > allowed:
                    diffs.append(f"{where}: relative {r:.2e} > tolerance {allowed:.2e}")
    ws, hs = stored["model"]["sample"], got["model"]["sample"]
    for module in sorted(ws.keys() | hs.keys()):
        d = sample_distance(ws.get(module, []), hs.get(module, []))
        allowed = tol_model.get(module, FLOOR["model"])
        if d > allowed:
            diffs.append(f"model {module}: relative L2 distance {d:.2e} > tolerance {allowed:.2e}")
    # modules without floating values (the queue pointers): exactly
    wsum, hsum = stored["model"]["sum_and_sum_of_squares"], got["model"]["sum_and_sum_of_squares"]
    for module in sorted((wsum.keys() | hsum.keys()) - (ws.keys() | hs.keys())):
        if wsum.get(module) != hsum.get(module):
            diffs.append(f"model {module}: {wsum.get(module)} -> {hsum.get(module)}")
    return _limit(diffs, limit)


def measure_spread(reference: dict, others: list[dict]) -> dict:
    """The largest difference between ``reference`` (one case's record) and each record of
    ``others`` (the same case elsewhere): per float metric and line, the relative difference;
    per module, the relative L2 distance of the weight samples (records without samples, from
    before they were kept, give metrics only)."""
    metrics: dict[str, list[float]] = {}
    for i, line in enumerate(reference["metrics"]):
        for k, v in line.items():
            if k in EXACT_KEYS or k in NOISY_KEYS or not isinstance(v, float):
                continue
            spread = metrics.setdefault(k, [0.0] * len(reference["metrics"]))
            for other in others:
                w = other["metrics"][i].get(k) if i < len(other["metrics"]) else None
                if isinstance(w, float):
                    spread[i] = max(spread[i], relative(v, w))
    model = {}
    for module, sample in reference["model"].get("sample", {}).items():
        dists = [
            sample_distance(sample, o["model"]["sample"][module])
            for o in others
            if module in o["model"].get("sample", {})
        ]
        model[module] = max(dists, default=0.0)
    return {"metrics": metrics, "model": model}


def tolerance_from_spread(spread: dict) -> dict:
    """:data:`FACTOR` x the spread, at least the floor (one case's entry). A metric's tolerance
    at line i is FACTOR x the largest spread of lines 0..i: rounding differences only grow over
    training, and a spread measured on a few CPUs is noisy line by line (held out, the AMX
    CPU's values exceeded FACTOR x the per-line spread of two emulated CPUs at 2 of 36 lines, and
    none of their running maximum)."""

    def tol(s: float, kind: str) -> float:
        return float(f"{max(FACTOR * s, FLOOR[kind]):.3g}")  # 3 digits: a readable file

    def running_max(values: list[float]) -> list[float]:
        return [max(values[: i + 1]) for i in range(len(values))]

    return {
        "metrics": {
            k: [tol(s, "metrics") for s in running_max(v)] for k, v in spread["metrics"].items()
        },
        "model": {m: tol(s, "model") for m, s in spread["model"].items()},
    }
