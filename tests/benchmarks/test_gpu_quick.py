"""``make gpu-quick``'s report and exit status (benchmarks/gpu_quick.py), run as a script with its
measurements replaced by planted figures (the toy run of test_gpu_scripts_at_toy_size.py
measures for real): each part is in quick.json, its ratios included, when the next starts; a
planted recompile, loss or queue mismatch, missing CUDA graph launch or collective difference
exits 1; the budget skips the parts it cannot fit.

Benchmarks are scripts, never imported by a test: one driver script (written to a temporary
folder) runs every scenario below in sequence in ONE process (a process per scenario would
cost its ~5 s of imports each), and writes per scenario the exit status, quick.json, quick.json
as it was when each step part started, and what it printed; the tests read that."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import ROOT as REPO
from tests.helpers.mistakes import run_tool

# the caller's path first (make test-oldest-torch puts the oldest torch there), as the toy run
PATH = {"PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(REPO)) if p)}

# The driver: gpu_quick's main with planted figures for its measurements (gpu_quick.Measures:
# the step parts, the plain steps, the world-1 collectives), for each scenario of
# scenarios.json. A scenario's ``plant`` maps a variant to the fields it changes (a ``_queues``
# list becomes a tensor); ``world1`` is the collectives' differences; ``budget`` runs
# gpu_quick.QuickReport alone against a 0.3 s budget.
DRIVER = '''
import contextlib, io, json, sys, time, traceback
from pathlib import Path

import torch

import benchmarks.gpu_quick as gpu_quick

PLAIN_TFLOPS = {False: 2.0, True: 4.0}  # eager, compiled


def plain(device, compiled=False, **kwargs):
    seconds = 0.5 if compiled else 1.0
    return {"step": "plain", "compiled": compiled, "seconds_per_iteration": seconds,
            "tflops": PLAIN_TFLOPS[compiled]}


def step(variant, flops, plant):
    ms = {"eager": 100.0, "compiled": 50.0, "cudagraphs": 40.0, "static": 90.0}[variant]
    g = torch.Generator().manual_seed(0)
    queues = torch.nn.functional.normalize(torch.randn(2, 8, 4, generator=g), dim=-1)
    fields = dict(plant.get(variant, {}))
    if "_queues" in fields:
        fields["_queues"] = torch.tensor(fields["_queues"])
    return {
        "ms_per_step": ms, "ms_per_step_spread": [ms, ms], "compile_seconds": 1.0,
        "flops_per_step": flops or int(1e12), "tflops": (flops or 1e12) / (ms / 1e3) / 1e12,
        "graphs_after_step_1": 0, "recompile_causes": [], "graph_breaks": {},
        "graph_launches": 3 if variant == "cudagraphs" else 0, "cudagraph_skip_reasons": [],
        "losses": [4.0, 3.9], "_queues": queues, **fields,
    }


def read(out):
    return json.loads((out / "quick.json").read_text())


def run_main(out, scenario):
    seen = {}

    def step_part(device, batch, variant, tiny, flops):
        seen[variant] = read(out)
        return step(variant, flops, scenario.get("plant", {}))

    diffs = {"differences": scenario.get("world1") or {"x": 0.0}, "tolerance": 1e-5}
    measures = gpu_quick.Measures(plain, step_part, lambda device, fn: diffs)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            code = gpu_quick.main(["--device", "cpu", "--out", str(out), *scenario["argv"]],
                                  measures)  # fmt: skip
    except SystemExit as e:
        code = e.code
    return {"code": code, "report": read(out), "seen": seen, "stdout": printed.getvalue()}


def run_budget(out):
    """A part starts only with the time it needs left; the skip is written, not killed."""
    q = gpu_quick.QuickReport(out, budget=0.3, header={}, min_seconds={"b": 0.1})
    with contextlib.redirect_stdout(io.StringIO()):
        a = q.part("a", lambda: time.sleep(0.25) or {"x": 1})
        b = q.part("b", lambda: {"x": 2})  # 0.05 s left, 0.1 s needed
    return {"a": a, "b": b, "report": read(out), "failures": q.report["failures"]}


root = Path(sys.argv[1])
results = {"PARTS": list(gpu_quick.PARTS)}
for name, scenario in json.loads((root / "scenarios.json").read_text()).items():
    out = root / name
    out.mkdir()
    try:
        results[name] = run_budget(out) if scenario.get("budget") else run_main(out, scenario)
    except Exception:
        results[name] = {"driver_error": traceback.format_exc()}
(root / "results.json").write_text(json.dumps(results))
'''

FAULTS = {  # the scenario: (plant, world1, the failure it writes)
    "recompile": (
        {"compiled": {"graphs_after_step_1": 1, "recompile_causes": ["iteration 3: forward"]}},
        None, "lorac_compiled: 1 graph(s) added after step 1: iteration 3: forward"),
    "graph_break": (
        {"cudagraphs": {"graph_breaks": {"print": 1}}}, None, "lorac_cudagraphs: graph breaks"),
    "loss": ({"compiled": {"losses": [4.0, 4.0]}}, None, "compiled_equals_eager: compiled: a loss"),
    "queue": (
        {"cudagraphs": {"_queues": [[[0.5] * 4] * 8] * 2}}, None,  # every row the same
        "compiled_equals_eager: cudagraphs: a queue row at cosine"),
    "no_graph_launch": (
        {"cudagraphs": {"graph_launches": 0, "cudagraph_skip_reasons": ["partitioned"]}}, None,
        "lorac_cudagraphs: no CUDA graph launched in the profiled step (partitioned)"),
    "collective": (
        {}, {"syncbn_output": 1e-3}, "collectives_world1_syncbn: syncbn_output differs"),
}  # fmt: skip

SCENARIOS = {
    "clean": {"argv": []},
    **{f"fault_{name}": {"argv": ["--require-graph-launch"], "plant": plant, "world1": world1}
       for name, (plant, world1, _) in FAULTS.items()},
    # eager losses of 0: the comparison's relative differences divide by zero
    "raises": {"argv": [], "plant": {"eager": {"losses": [0.0, 0.0]}}},
    "budget": {"budget": True},
    "no_budget": {"argv": ["--budget", "0"]},
    "parts": {"argv": ["--parts", "lorac_eager", "lorac_cudagraphs"]},
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every scenario's result, from one run of the driver script."""
    root = tmp_path_factory.mktemp("gpu_quick")
    (root / "scenarios.json").write_text(json.dumps(SCENARIOS))
    (root / "planted_gpu_quick.py").write_text(DRIVER)
    r = run_tool([str(root / "planted_gpu_quick.py"), str(root)], timeout=300, **PATH)
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads((root / "results.json").read_text())
    for name in SCENARIOS:
        assert "driver_error" not in results[name], results[name]["driver_error"]
    return results


def test_each_part_is_written_with_its_ratios_before_the_next_starts(runs):
    run = runs["clean"]
    assert run["code"] == 0
    # when the compiled step started, the eager one was on disk with its ratio to plain eager
    eager = run["seen"]["compiled"]["parts"]["lorac_eager"]
    assert eager["ms_per_step"] == 100.0 and eager["ratio_to_plain_eager"] == pytest.approx(5.0)
    assert list(run["seen"]["cudagraphs"]["parts"]) == ["plain_eager", "lorac_eager",
                                                        "lorac_compiled"]  # fmt: skip
    report = run["report"]
    assert list(report["parts"]) == runs["PARTS"]
    graphs = report["parts"]["lorac_cudagraphs"]
    # the eager step's FLOPs over its time, against both plain steps (the compiled one is
    # measured later and added then)
    assert graphs["tflops"] == pytest.approx(25.0)
    assert graphs["ratio_to_plain_eager"] == pytest.approx(12.5)
    assert graphs["ratio_to_plain_compiled"] == pytest.approx(6.25)
    assert report["failures"] == [] and report["compile_threads"] >= 1


@pytest.mark.parametrize("name", list(FAULTS))
def test_a_planted_fault_fails_the_quick_check(runs, name):
    run, failure = runs[f"fault_{name}"], FAULTS[name][2]
    assert run["code"] == 1
    bad = run["report"]["failures"]
    assert any(b.startswith(failure) for b in bad), bad
    assert "FAILED: " in run["stdout"]


def test_a_part_that_raises_fails_the_check_and_the_rest_still_run(runs):
    run = runs["raises"]
    assert run["code"] == 1
    parts = run["report"]["parts"]
    assert parts["compiled_equals_eager"]["error"].startswith("ZeroDivisionError")
    assert "ms_per_step" in parts["lorac_static"]


def test_the_budget_skips_the_parts_it_cannot_fit(runs):
    """A part starts only with the time it needs left; the skip is written, not killed."""
    run = runs["budget"]
    assert run["a"] == {"x": 1}
    assert run["b"] is None  # 0.05 s left, 0.1 s needed
    parts = run["report"]["parts"]
    assert parts["a"]["x"] == 1 and "budget" in parts["b"]["skipped"]
    assert run["failures"] == []


def test_no_budget_left_skips_every_part_and_exits_0(runs):
    run = runs["no_budget"]
    assert run["code"] == 0
    parts = run["report"]["parts"]
    assert set(parts) == set(runs["PARTS"]) - {"compiled_equals_eager"}
    assert all("skipped" in v for v in parts.values())


def test_parts_runs_the_named_parts_only(runs):
    run = runs["parts"]
    assert run["code"] == 0
    parts = run["report"]["parts"]
    assert [k for k, v in parts.items() if "skipped" not in v] == [
        "lorac_eager", "lorac_cudagraphs", "compiled_equals_eager"
    ]  # fmt: skip
    assert parts["plain_eager"]["skipped"] == "not in --parts"
