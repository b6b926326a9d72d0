"""The next batch on its way to the GPU while the current step runs.

When a batch is handed to the step, the copy of the following one (~15 MB of uint8 views per
GPU, from the loader's pinned memory) is issued on a side stream, so that it overlaps the step
instead of waiting for it; the compute stream waits for it by an event, not a host sync, and
``record_stream`` keeps the allocator from reusing its memory too early. Only CUDA has streams:
elsewhere the batches are handed over as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pretrain.data.color import ColorParams
from pretrain.utils.shuffle_plan import ShufflePlan

__all__ = ["DEVICE_KEYS", "prefetch_to_device"]

# What the step reads on the device; the rest of a batch (sample seeds, indices, file names, the
# iteration) is read on the host.
DEVICE_KEYS = ("views", "color_params", "shuffle_plans")


def prefetch_to_device(loader: Iterable[dict], device: torch.device | str) -> Iterable[dict]:
    """``loader`` whose batches arrive with their :data:`DEVICE_KEYS` on ``device`` (CUDA: copied
    on a side stream one batch ahead); ``loader`` itself on any other device."""
    device = torch.device(device)
    return _CudaPrefetcher(loader, device) if device.type == "cuda" else loader


class _CudaPrefetcher:
    def __init__(self, loader: Iterable[dict], device: torch.device) -> None:
        self.loader, self.device = loader, device

    def __iter__(self) -> Iterator[dict]:
        return _CudaPrefetchIterator(iter(self.loader), self.device)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]


class _CudaPrefetchIterator:
    def __init__(self, it: Iterator[dict], device: torch.device) -> None:
        self.it, self.device = it, device
        self.stream = torch.cuda.Stream(device)
        self._next: dict | None = None
        self._done = False
        self._load()

    def _load(self) -> None:
        """Fetch the next batch and issue its copies on the side stream."""
        try:
            batch = next(self.it)
        except StopIteration:
            self._next, self._done = None, True
            return
        with torch.cuda.stream(self.stream):
            moved = {k: _to(batch[k], self.device) for k in DEVICE_KEYS if k in batch}
        self._next = {**batch, **moved}

    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if self._done:
            raise StopIteration
        compute = torch.cuda.current_stream(self.device)
        compute.wait_stream(self.stream)  # the batch's copies before the step's kernels
        batch = self._next
        for t in _tensors([batch[k] for k in DEVICE_KEYS if k in batch]):
            t.record_stream(compute)  # its memory is in use until the step's kernels are done
        self._load()  # the next batch's copies overlap this step
        return batch

    def __getattr__(self, name: str) -> Any:
        # the loader iterator's own (``_shutdown_workers``: the trainer shuts the workers down)
        if name == "it":  # not set yet (a copy, an unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.it, name)


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, (ColorParams, ShufflePlan)):
        return value.to(device)  # non-blocking, through pinned memory
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, ColorParams):
        return list(value.tensors.values())
    if isinstance(value, ShufflePlan):
        return [value.table]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []
