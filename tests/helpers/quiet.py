"""What the tests of a tool's output need: a machine of 2 cores, and torch's CUDA_HOME notice
made to happen again in this process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

__all__ = ["CUDA_HOME_NOTICE", "WORKER_WARNING", "patch_two_cores", "redo_cuda_home_notice"]

CUDA_HOME_NOTICE = "No CUDA runtime is found, using CUDA_HOME"
# torch's "This DataLoader will create 4 worker processes in total. Our suggested max ..."
WORKER_WARNING = "worker processes in total"


def patch_two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sees 2 cores, as torch's DataLoader and the workers' default count them."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(os, "cpu_count", lambda: 2)


def redo_cuda_home_notice(monkeypatch: pytest.MonkeyPatch, cuda_home: Path) -> bool:
    """Make the next import of ``torch.utils.cpp_extension`` (detectron2's environment report
    in ``env.txt`` does one) run the module again with ``CUDA_HOME`` set, as in a fresh process;
    returns whether torch then logs its notice (a CUDA build of torch without a GPU)."""
    monkeypatch.setenv("CUDA_HOME", str(cuda_home))
    name = "torch.utils.cpp_extension"
    if name in sys.modules:
        monkeypatch.setattr(torch.utils, "cpp_extension", sys.modules[name])  # put back after
        monkeypatch.delitem(sys.modules, name)
    cuda_build = torch.backends.cuda.is_built() and torch.version.cuda
    return bool(cuda_build) and not torch.cuda.is_available()


def record_loader_workers(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A machine of 2 cores, the tools' warnings shown (``--verbose``); returns the list that
    receives the ``num_workers`` of every DataLoader built from then on."""
    from torch.utils.data import DataLoader

    patch_two_cores(monkeypatch)
    monkeypatch.setattr(sys, "argv", ["tool", "--verbose"])
    built: list[int] = []
    init = DataLoader.__init__

    def record(self: DataLoader, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)
        built.append(self.num_workers)

    monkeypatch.setattr(DataLoader, "__init__", record)
    return built
