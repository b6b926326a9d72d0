"""Every resumable classification tool resumes exactly (tests/helpers/resume.py): the linear
probe, semi-supervised fine-tuning and the 12-dataset harness, stopped by Ctrl-C after the first
step, mid-epoch, at an epoch or stage boundary and after the last step, then resumed, end with
the uninterrupted run's weights, optimizer state and results, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.classification import (  # noqa: F401
    IMAGENET_CLASSES,
    QUICK,
    make_dtd,
    make_imagenet,
    single_thread,
)
from tests.helpers.mistakes import ToolResult, run_main
from tests.helpers.resume import assert_resumes_exactly
from transfer.classification import transfer
from transfer.cli import linear_probe, semi_supervised, transfer_linear


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    split = root / "1percent.txt"
    split.write_text("".join(f"{c}_{i}.JPEG\n" for c in IMAGENET_CLASSES for i in range(2)))
    make_dtd(str(root / "transfer" / "dtd"))
    return {
        "imagenet": Path(make_imagenet(str(root / "imagenet"))),
        "split": split,
        "transfer": root / "transfer",
        "runs": root / "full",  # the uninterrupted runs, shared by the cases of a tool
    }


def _probe(data: dict) -> callable:
    # 18 training images in batches of 4: epoch 0 is iterations 0-3
    def run(out: Path, resume: bool) -> ToolResult:
        argv = ["--config-file", f"{QUICK}/linear_instant.yaml", "--random-init", "resnet18",
                "--data-root", str(data["imagenet"]), "--output-dir", str(out), "--device", "cpu",
                "SOLVER.MAX_ITER", "6", "SOLVER.CHECKPOINT_PERIOD", "100"]  # fmt: skip
        return run_main(linear_probe.main, [*argv, *(["--resume"] if resume else [])])

    return run


def test_linear_probe_stopped_mid_epoch_resumes_bit_identical(data, tmp_path, monkeypatch):
    """The cheap case of make test: Ctrl-C after iteration 2 of 6, in the first epoch."""
    full = data["runs"] / "probe"
    assert_resumes_exactly(_probe(data), full, tmp_path / "cut", 2, monkeypatch)


@pytest.mark.protocols
@pytest.mark.parametrize("k", [0, 3, 5], ids=["first", "epoch-end", "last"])
def test_linear_probe_stopped_anywhere_resumes_bit_identical(k, data, tmp_path, monkeypatch):
    full = data["runs"] / "probe"
    assert_resumes_exactly(_probe(data), full, tmp_path / "cut", k, monkeypatch)


def _semi(data: dict) -> callable:
    # two lrs of 3 iterations each (steps 0-2 and 3-5); 6 labelled images in batches of 4
    def run(out: Path, resume: bool) -> ToolResult:
        argv = ["--config-file", f"{QUICK}/semi_instant.yaml", "--random-init", "resnet18",
                "--data-root", str(data["imagenet"]), "--split-file", str(data["split"]),
                "--output-dir", str(out), "--device", "cpu", "SOLVER.MAX_ITER", "3"]  # fmt: skip
        return run_main(semi_supervised.main, [*argv, *(["--resume"] if resume else [])])

    return run


@pytest.mark.protocols
@pytest.mark.parametrize("k", [0, 1, 2, 5], ids=["first", "mid-lr", "lr-end", "last"])
def test_semi_supervised_stopped_anywhere_resumes_bit_identical(k, data, tmp_path, monkeypatch):
    full = data["runs"] / "semi"
    run = _semi(data)
    assert_resumes_exactly(run, full, tmp_path / "cut", k, monkeypatch, "semi_results.json")


def _transfer(data: dict, protocol: str) -> callable:
    # dtd: a sweep of 5 iterations (steps 0-4), the final fit of 5 (steps 5-9)
    def run(out: Path, resume: bool) -> ToolResult:
        argv = ["--config-file", f"{QUICK}/transfer_{protocol}_instant.yaml".replace(
                "_cached_features", ""), "--random-init", "resnet18", "--data-root",
                str(data["transfer"]), "--datasets", "dtd", "--output-dir", str(out),
                "--device", "cpu", "TRANSFER.NUM_LRS", "2"]  # fmt: skip
        return run_main(transfer_linear.main, [*argv, *(["--resume"] if resume else [])])

    return run


@pytest.mark.protocols
@pytest.mark.parametrize("k", [0, 2, 4, 9], ids=["first", "mid-sweep", "sweep-end", "last"])
def test_transfer_augmented_stopped_anywhere_resumes_bit_identical(k, data, tmp_path, monkeypatch):
    full = data["runs"] / "transfer_augmented"
    assert_resumes_exactly(_transfer(data, "augmented"), full, tmp_path / "cut", k, monkeypatch)


@pytest.mark.protocols
def test_transfer_cached_features_interrupted_resumes_from_finished_search_points(
    data, tmp_path, monkeypatch
):
    """Cached features: Ctrl-C in the final fit; --resume reads the sweep back (it is not
    trained again) and ends with the uninterrupted run's results."""
    run = _transfer(data, "cached_features")
    full = run(tmp_path / "full", False)
    assert full.returncode == 0, full.output[-3000:]
    real, calls = transfer.train_linear_heads, []

    def train_then_stop(*args, **kwargs):
        calls.append(kwargs["desc"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(transfer, "train_linear_heads", train_then_stop)
        stopped = run(tmp_path / "cut", False)
        assert stopped.returncode == 130, stopped.output[-3000:]
        assert "--resume" in stopped.output
        calls.clear()
        resumed = run(tmp_path / "cut", True)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert [c.split()[1] for c in calls] == ["final"]  # the sweep was read back
    done = [json.loads((tmp_path / d / "results.json").read_text()) for d in ("full", "cut")]
    assert done[0]["results"] == done[1]["results"]
