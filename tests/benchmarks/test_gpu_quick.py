"""``make gpu-quick``'s report and exit status (benchmarks/gpu_quick.py), in process, with its
measurements replaced by planted figures (the toy run of test_gpu_scripts_at_toy_size.py
measures for real): each part is in quick.json, its ratios included, when the next starts; a
planted recompile, loss or queue mismatch, missing CUDA graph launch or collective difference
exits 1; the budget skips the parts it cannot fit."""

from __future__ import annotations

import json
import time

import pytest
import torch

import benchmarks.bench_throughput as bench_throughput
import benchmarks.gpu_quick as gpu_quick

PLAIN_TFLOPS = {False: 2.0, True: 4.0}  # eager, compiled


def _plain(device: str, compiled: bool = False, **kwargs) -> dict:
    seconds = 0.5 if compiled else 1.0
    return {"step": "plain", "compiled": compiled, "seconds_per_iteration": seconds,
            "tflops": PLAIN_TFLOPS[compiled]}  # fmt: skip


def _step(variant: str, flops: int | None, **plant) -> dict:
    ms = {"eager": 100.0, "compiled": 50.0, "cudagraphs": 40.0, "static": 90.0}[variant]
    g = torch.Generator().manual_seed(0)
    queues = torch.nn.functional.normalize(torch.randn(2, 8, 4, generator=g), dim=-1)
    return {
        "ms_per_step": ms, "ms_per_step_spread": [ms, ms], "compile_seconds": 1.0,
        "flops_per_step": flops or int(1e12), "tflops": (flops or 1e12) / (ms / 1e3) / 1e12,
        "graphs_after_step_1": 0, "recompile_causes": [], "graph_breaks": {},
        "graph_launches": 3 if variant == "cudagraphs" else 0, "cudagraph_skip_reasons": [],
        "losses": [4.0, 3.9], "_queues": queues, **plant.get(variant, {}),
    }  # fmt: skip


@pytest.fixture
def planted(monkeypatch, tmp_path):
    """Runs main with planted figures: ``plant`` maps a variant to the fields it changes;
    ``seen`` gets quick.json as it is when each step part starts."""
    seen: dict[str, dict] = {}

    def run(argv: list[str] = (), plant: dict | None = None, world1: dict | None = None) -> int:
        def step_part(device, batch, variant, tiny, flops):
            seen[variant] = json.loads((tmp_path / "quick.json").read_text())
            return _step(variant, flops, **(plant or {}))

        monkeypatch.setattr(gpu_quick, "_step_part", step_part)
        monkeypatch.setattr(bench_throughput, "measure_plain", _plain)
        diffs = {"differences": world1 or {"x": 0.0}, "tolerance": 1e-5}
        monkeypatch.setattr(gpu_quick, "_world1", lambda device, fn: diffs)
        return gpu_quick.main(["--device", "cpu", "--out", str(tmp_path), *argv])

    run.seen = seen
    run.report = lambda: json.loads((tmp_path / "quick.json").read_text())
    return run


def test_each_part_is_written_with_its_ratios_before_the_next_starts(planted):
    assert planted() == 0
    # when the compiled step started, the eager one was on disk with its ratio to plain eager
    eager = planted.seen["compiled"]["parts"]["lorac_eager"]
    assert eager["ms_per_step"] == 100.0 and eager["ratio_to_plain_eager"] == pytest.approx(5.0)
    assert list(planted.seen["cudagraphs"]["parts"]) == ["plain_eager", "lorac_eager",
                                                         "lorac_compiled"]  # fmt: skip
    report = planted.report()
    assert list(report["parts"]) == list(gpu_quick.PARTS)
    graphs = report["parts"]["lorac_cudagraphs"]
    # the eager step's FLOPs over its time, against both plain steps (the compiled one is
    # measured later and added then)
    assert graphs["tflops"] == pytest.approx(25.0)
    assert graphs["ratio_to_plain_eager"] == pytest.approx(12.5)
    assert graphs["ratio_to_plain_compiled"] == pytest.approx(6.25)
    assert report["failures"] == [] and report["compile_threads"] >= 1


@pytest.mark.parametrize(
    "plant, world1, failure",
    [
        ({"compiled": {"graphs_after_step_1": 1, "recompile_causes": ["iteration 3: forward"]}},
         None, "lorac_compiled: 1 graph(s) added after step 1: iteration 3: forward"),
        ({"cudagraphs": {"graph_breaks": {"print": 1}}}, None, "lorac_cudagraphs: graph breaks"),
        ({"compiled": {"losses": [4.0, 4.0]}}, None, "compiled_equals_eager: compiled: a loss"),
        ({"cudagraphs": {"_queues": torch.ones(2, 8, 4) / 2}}, None,
         "compiled_equals_eager: cudagraphs: a queue row at cosine"),
        ({"cudagraphs": {"graph_launches": 0, "cudagraph_skip_reasons": ["partitioned"]}}, None,
         "lorac_cudagraphs: no CUDA graph launched in the profiled step (partitioned)"),
        ({}, {"syncbn_output": 1e-3}, "collectives_world1_syncbn: syncbn_output differs"),
    ],
    ids=["recompile", "graph_break", "loss", "queue", "no_graph_launch", "collective"],
)  # fmt: skip
def test_a_planted_fault_fails_the_quick_check(planted, plant, world1, failure, capsys):
    assert planted(["--require-graph-launch"], plant, world1) == 1
    bad = planted.report()["failures"]
    assert any(b.startswith(failure) for b in bad), bad
    assert "FAILED: " in capsys.readouterr().out


def test_a_part_that_raises_fails_the_check_and_the_rest_still_run(planted, monkeypatch):
    monkeypatch.setattr(gpu_quick, "_equal_numbers", lambda *a: 1 / 0)
    assert planted() == 1
    parts = planted.report()["parts"]
    assert parts["compiled_equals_eager"]["error"].startswith("ZeroDivisionError")
    assert "ms_per_step" in parts["lorac_static"]


def test_the_budget_skips_the_parts_it_cannot_fit(tmp_path):
    """A part starts only with the time it needs left; the skip is written, not killed."""
    q = gpu_quick.QuickReport(tmp_path, budget=0.3, header={}, min_seconds={"b": 0.1})
    assert q.part("a", lambda: time.sleep(0.25) or {"x": 1}) == {"x": 1}
    assert q.part("b", lambda: {"x": 2}) is None  # 0.05 s left, 0.1 s needed
    parts = json.loads((tmp_path / "quick.json").read_text())["parts"]
    assert parts["a"]["x"] == 1 and "budget" in parts["b"]["skipped"]
    assert q.report["failures"] == []


def test_no_budget_left_skips_every_part_and_exits_0(planted):
    assert planted(["--budget", "0"]) == 0
    parts = planted.report()["parts"]
    assert set(parts) == set(gpu_quick.PARTS) - {"compiled_equals_eager"}
    assert all("skipped" in v for v in parts.values())


def test_parts_runs_the_named_parts_only(planted):
    assert planted(["--parts", "lorac_eager", "lorac_cudagraphs"]) == 0
    parts = planted.report()["parts"]
    assert [k for k, v in parts.items() if "skipped" not in v] == [
        "lorac_eager", "lorac_cudagraphs", "compiled_equals_eager"
    ]  # fmt: skip
    assert parts["plain_eager"]["skipped"] == "not in --parts"
