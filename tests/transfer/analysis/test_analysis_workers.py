"""``analyze_nuclear_norm``'s loader workers fit the cores: ``--num-workers`` defaults to -1,
one per core of the process less one (as in pretraining), so on 2 cores its loaders start fewer
workers than cores and torch's "This DataLoader will create N worker processes" warning is not
raised; an explicit count is kept, and a negative one other than -1 is a user error."""

from __future__ import annotations

import warnings

import pytest
import torch

from pretrain.utils.errors import ConfigError
from tests.helpers import make_image_folder
from tests.helpers.analysis import make_run
from tests.helpers.mistakes import assert_user_error, run_main, snapshot
from tests.helpers.quiet import WORKER_WARNING, record_loader_workers
from transfer.analysis.nuclear_norm_outputs import AnalysisOptions, analyze
from transfer.cli import analyze_nuclear_norm


@pytest.fixture
def run_and_data(tmp_path):
    """One tiny pretrained run and an image folder with train/ and val/; one torch thread."""
    data = tmp_path / "data"
    make_image_folder(data / "train", classes=2, per_class=2, size=24)
    make_image_folder(data / "val", classes=2, per_class=2, size=24)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield make_run(tmp_path / "run", data, seed=1), data
    torch.set_num_threads(threads)


@pytest.fixture
def loader_workers(monkeypatch) -> list[int]:
    return record_loader_workers(monkeypatch)


def test_analyze_nuclear_norm_workers_fit_two_cores(run_and_data, tmp_path, loader_workers):
    run, data = run_and_data
    argv = [str(run), "--dataset", "imagefolder", "--data-root", str(data), "--out",
            str(tmp_path / "out"), "--max-images", "2", "--views", "2", "--knn-train", "4",
            "--knn-k", "2", "--device", "cpu", "--verbose"]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert analyze_nuclear_norm.main(argv) == 0
    assert [str(w.message) for w in caught if WORKER_WARNING in str(w.message)] == []
    # 2 cores less one for the process, in the nuclear-norm and the kNN loaders
    assert len(loader_workers) >= 2 and set(loader_workers) == {1}


def test_explicit_workers_are_kept(run_and_data, loader_workers):
    run, data = run_and_data
    opt = AnalysisOptions("imagefolder", str(data), views=2, max_images=1, num_workers=0)
    analyze([str(run)], opt)
    assert set(loader_workers) == {0}
    with pytest.raises(ConfigError, match="--num-workers = -2: a number >= 0, or -1"):
        analyze([str(run)], AnalysisOptions("imagefolder", str(data), num_workers=-2))


def test_workers_below_minus_one_are_one_error_naming_the_flag(run_and_data, tmp_path):
    run, data = run_and_data
    out = tmp_path / "out"
    before = snapshot(out)
    argv = [str(run), "--dataset", "imagefolder", "--data-root", str(data), "--out", str(out),
            "--num-workers", "-2"]  # fmt: skip
    r = run_main(analyze_nuclear_norm.main, argv)
    assert_user_error(r, before, out, match="--num-workers")
