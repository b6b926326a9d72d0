"""The exact-resume contract of every resumable tool, tested one way.

A run stopped by Ctrl-C after training step ``k`` (SIGINT raised in this process right after the
step, as a terminal delivers it; the tool's own stop path saves and exits 130) and resumed with
``--resume`` must end as the uninterrupted run: every tensor of every final checkpoint under the
run directory (parameters, buffers, optimizer and scheduler state, iteration) bit-identical,
and the same results file. ``k`` counts the steps of every training the run makes (a sweep's
lrs, the transfer harness's datasets and search points) from 0.
"""

from __future__ import annotations

import itertools
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from detectron2.engine import SimpleTrainer

from tests.helpers.mistakes import ToolResult

__all__ = ["assert_resumes_exactly", "final_state", "stop_after_step"]

STOPPED = "stopped after iteration"


def stop_after_step(monkeypatch: pytest.MonkeyPatch, k: int, trainer=SimpleTrainer) -> None:
    """Ctrl-C right after the ``k``-th step (from 0) that ``trainer``'s ``run_step`` makes."""
    step, count = trainer.run_step, itertools.count()

    def run_step(self) -> None:
        step(self)
        if next(count) == k:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(trainer, "run_step", run_step)


def _tensors(prefix: str, value: object) -> Iterator[tuple[str, object]]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "rng":  # see final_state
                yield from _tensors(f"{prefix}/{key}", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _tensors(f"{prefix}/{i}", item)
    else:
        yield prefix, value


def final_state(out: Path) -> dict[str, object]:
    """Every value of every ``model_final.pth`` under ``out`` but the global generators' states
    (``rng``: they differ by the draw a resumed run's new data loader makes for its workers'
    seeds, which no training step reads), flattened."""
    state: dict[str, object] = {}
    for path in sorted(out.rglob("model_final.pth")):
        state.update(_tensors(str(path.relative_to(out)), torch.load(path, weights_only=True)))
    return state


def _results(out: Path, results: str) -> dict:
    return json.loads((out / results).read_text())["results"]


def assert_resumes_exactly(
    run: Callable[[Path, bool], ToolResult],
    full: Path,
    cut: Path,
    k: int,
    monkeypatch: pytest.MonkeyPatch,
    results: str = "results.json",
    trainer: type = SimpleTrainer,
) -> None:
    """``run(out, resume)`` runs the tool into ``out``: ``full`` holds (or is given) the
    uninterrupted run; the run into ``cut``, stopped after step ``k`` of ``trainer``
    (:func:`stop_after_step`) and resumed, ends with :func:`final_state` and ``results`` (``""``:
    a tool without one) equal to ``full``'s."""
    if not (full / (results or "model_final.pth")).is_file():
        done = run(full, False)
        assert done.returncode == 0, done.output[-3000:]
    with monkeypatch.context() as m:
        stop_after_step(m, k, trainer)
        stopped = run(cut, False)
    assert stopped.returncode == 130, stopped.output[-3000:]
    assert STOPPED in stopped.stderr and "Traceback" not in stopped.output, stopped.output[-3000:]
    assert not (cut / (results or "model_final.pth")).exists()
    resumed = run(cut, True)
    assert resumed.returncode == 0, resumed.output[-3000:]
    a, b = final_state(full), final_state(cut)
    assert a and a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
        else:
            assert value == b[key], key
    if results:
        assert _results(full, results) == _results(cut, results)
