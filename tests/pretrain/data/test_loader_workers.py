"""The loader uses the cores there are, and its batches arrive in shared memory without a copy.

``DATALOADER.NUM_WORKERS -1`` resolves to the cores of the process's CPU affinity (mocked here),
shared by the training processes of a machine when each sees all of it, capped by SLURM's
CPUs per task, less one; the shared-memory check and the loader use that number. A worker
collates a batch into one block of shared memory, which the main process receives as is.
"""

from __future__ import annotations

import logging
from collections import namedtuple

import pytest
import torch

from pretrain.config.defaults import get_cfg, load_config
from pretrain.data import loader
from pretrain.data.loader import (
    AUTO_WORKERS,
    build_pretrain_loader,
    check_shared_memory,
    collate_views,
    resolve_num_workers,
    shared_memory_need,
)
from pretrain.utils.errors import ConfigError
from tests.helpers import tiny_opts
from transfer.classification.demo import DEMO_CONFIG

_Usage = namedtuple("_Usage", "total used free")


@pytest.fixture
def machine(monkeypatch):
    """Mock the CPU affinity (``cores`` of ``machine`` cores) and an environment without SLURM."""

    def set_machine(cores: int, machine_cores: int | None = None) -> None:
        monkeypatch.setattr(loader.os, "sched_getaffinity", lambda pid: set(range(cores)))
        monkeypatch.setattr(loader.os, "cpu_count", lambda: machine_cores or cores)

    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    return set_machine


def test_default_is_auto():
    assert get_cfg().DATALOADER.NUM_WORKERS == AUTO_WORKERS == -1


@pytest.mark.parametrize(
    "cores, machine_cores, procs, slurm, expected",
    [
        (16, 16, 1, None, 15),  # a process alone on a 16-core machine
        (128, 128, 8, None, 15),  # torchrun / --num-gpus 8 on a 128-core node: 16 each
        (16, 128, 8, None, 15),  # SLURM bound each of 8 tasks to its own 16 cores
        (64, 128, 4, "16", 15),  # 4 tasks sharing the job's 64 cores: SLURM_CPUS_PER_TASK
        (128, 128, 8, "16", 15),  # a whole node, SLURM's count wins over the division
        (2, 2, 2, None, 0),  # two processes on two cores: no core left for workers
        (1, 1, 1, None, 0),
        (2, 2, 1, None, 1),  # this machine, one process
        (12, 12, 8, None, 0),  # fewer cores than processes: at least 0
    ],
)
def test_auto_workers_are_the_cores_less_one(machine, monkeypatch, cores, machine_cores, procs,
                                            slurm, expected):  # fmt: skip
    machine(cores, machine_cores)
    if slurm is not None:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", slurm)
    assert resolve_num_workers(AUTO_WORKERS, procs) == expected


def test_explicit_workers_win(machine):
    machine(64)
    assert resolve_num_workers(0, 8) == 0
    assert resolve_num_workers(3, 8) == 3
    assert resolve_num_workers(100, 1) == 100


def test_workers_below_minus_one_are_refused():
    with pytest.raises(ConfigError, match="DATALOADER.NUM_WORKERS = -2: a number >= 0, or -1"):
        resolve_num_workers(-2)


def test_arguments_replace_the_machine(machine):
    """The keyword arguments describe another machine than the mocked one."""
    machine(4)
    got = resolve_num_workers(-1, 8, cores=set(range(128)), machine_cores=128, environ={})
    assert got == 15
    assert resolve_num_workers(-1, 1, cores={0, 1, 2}, environ={"SLURM_CPUS_PER_TASK": "2"}) == 1


def _cfg(tmp_path, **extra):
    return load_config(DEMO_CONFIG, tiny_opts(tmp_path, tmp_path / "out", **extra))


def test_shared_memory_check_counts_the_resolved_workers(tmp_path, machine, monkeypatch, caplog):
    """With -1 on a mocked 5-core machine the check counts 4 workers and says so."""
    machine(5)
    views = {"INPUT.LARGE_CROPS": 3, "INPUT.SMALL_CROPS": 2, "DATALOADER.NUM_WORKERS": -1}
    cfg = _cfg(tmp_path, **views)
    per_worker = 4 * 8 * 3 * (3 * 32**2 + 2 * 16**2)  # 4 prefetched batches of 8 images
    assert shared_memory_need(cfg, 1) == 4 * per_worker
    # two processes on the 5 cores: 1 worker each, each with half the batch
    assert shared_memory_need(cfg, 2, procs_on_machine=2) == 2 * 1 * (per_worker // 2)
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(loader.shutil, "disk_usage", lambda p: _Usage(2**20, 0, 2**20))
    with caplog.at_level("WARNING"):
        msg = check_shared_memory(cfg, 1, shm=str(shm))
    assert "DATALOADER.NUM_WORKERS 4 (-1: one per core)" in msg
    machine(1)  # one core: no workers, nothing to check
    assert check_shared_memory(cfg, 1, shm=str(shm)) is None


def test_loader_starts_the_resolved_workers_and_logs_them_once(tmp_path, image_folder, machine):
    machine(7)
    cfg = _cfg(tmp_path, **{"DATASETS.ROOT": str(image_folder), "DATALOADER.NUM_WORKERS": -1})
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger(loader.__name__)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        first = build_pretrain_loader(cfg, 0, 1, 0, procs_on_machine=1)
        again = build_pretrain_loader(cfg, 0, 1, 0, procs_on_machine=1)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert first.num_workers == again.num_workers == 6
    said = [r.getMessage() for r in records if "NUM_WORKERS -1" in r.getMessage()]
    assert len(said) == 1 and "6 data workers per process" in said[0]
    two = build_pretrain_loader(cfg, 0, 1, 0, procs_on_machine=2)  # 7 cores, 2 processes
    assert two.num_workers == 2


def _items(n: int = 3, views=((3, 8, 8), (3, 4, 4))) -> list[dict]:
    from pretrain.data.color import ColorSpec, sample_color_params

    g = torch.Generator().manual_seed(0)
    return [
        {"views": [torch.randint(0, 256, s, dtype=torch.uint8, generator=g) for s in views],
         "color": sample_color_params(len(views), ColorSpec(), g), "index": i, "seed": 10 + i,
         "iteration": 4, "skipped_files": []}
        for i in range(n)
    ]  # fmt: skip


def test_collate_into_shared_memory_is_one_block_with_the_same_values():
    items = _items()
    private = collate_views(items, run_seed=1, key_crops=1)
    shared = collate_views(items, run_seed=1, key_crops=1, shared_memory=True)
    tensors = [*shared["views"], shared["index"], shared["seeds"]]
    for params in shared["color_params"]:
        tensors += list(params.tensors.values())
    assert all(t.is_shared() for t in tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1  # one block
    assert not private["views"][0].is_shared()
    for a, b in zip(private["views"], shared["views"], strict=True):
        assert torch.equal(a, b) and b.is_contiguous()
    assert torch.equal(private["index"], shared["index"])
    assert torch.equal(private["seeds"], shared["seeds"])
    assert shared["seeds"].tolist() == [10, 11, 12]
    for p, s in zip(private["color_params"], shared["color_params"], strict=True):
        assert list(p.tensors) == list(s.tensors)
        for f in p.tensors:
            assert torch.equal(p.tensors[f], s.tensors[f]), f


def test_collate_aligns_every_tensor():
    """Each tensor of the block starts on a 64-byte boundary (typed views need their alignment)."""
    batch = collate_views(_items(n=5, views=((3, 7, 7), (3, 5, 5))), shared_memory=True)
    first = batch["color_params"][0]  # view 0's fields start each field's (views, B) tensor
    tensors = [*batch["views"], batch["index"], batch["seeds"]]
    tensors += list(first.tensors.values())
    base = batch["views"][0].untyped_storage().data_ptr()
    assert len(tensors) == 10
    assert all((t.data_ptr() - base) % 64 == 0 for t in tensors)


def test_worker_batches_arrive_in_shared_memory_as_one_block(tmp_path, image_folder):
    """Through a real worker: the main process maps the worker's block (no copy, one handle)."""
    cfg = _cfg(tmp_path, **{"DATASETS.ROOT": str(image_folder), "DATALOADER.NUM_WORKERS": 1})
    batch = next(iter(build_pretrain_loader(cfg, 0, 1, 0, procs_on_machine=1)))
    tensors = [*batch["views"], batch["index"], batch["seeds"]]
    for params in batch["color_params"]:
        tensors += list(params.tensors.values())
    assert all(t.is_shared() for t in tensors)
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert [tuple(v.shape) for v in batch["views"]] == [(8, 3, 32, 32)] * 3
