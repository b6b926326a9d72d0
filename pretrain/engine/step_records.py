"""The iterations not yet logged: their device values, kept without a host sync until the trainer
reads them all at once at its logging period (:meth:`StepRecords.take`).

Each step's values are copied into a row of a device ring buffer indexed by a device counter,
so that a step runs the same ops and nothing holds on to its outputs (a CUDA graph replay
overwrites them). A shorter row is zero-padded; its record knows its count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch

__all__ = ["StepRecord", "StepRecords"]


@dataclass
class StepRecord:
    """One iteration's values for the log: device tensors until :meth:`StepRecords.take`."""

    iteration: int
    losses: dict[str, Any]
    data_time: float
    metrics: dict[str, Any]
    step_time: float
    skipped: list[str]

    def tensors(self) -> list[torch.Tensor]:
        return [v for v in (*self.losses.values(), *self.metrics.values()) if _is_tensor(v)]

    def on_host(self, values: Iterator[float]) -> StepRecord:
        """This record with its device values (tensors, or values kept in a ring buffer)
        replaced, in :meth:`tensors` order, by ``values``."""

        def host(d: dict[str, Any]) -> dict[str, Any]:
            return {k: next(values) if _on_device(v) else v for k, v in d.items()}

        return replace(self, losses=host(self.losses), metrics=host(self.metrics))

    def in_ring(self) -> StepRecord:
        """This record without references to its tensors (their values are in a ring row)."""

        def placeholders(d: dict[str, Any]) -> dict[str, Any]:
            return {k: _IN_RING if _is_tensor(v) else v for k, v in d.items()}

        return replace(self, losses=placeholders(self.losses), metrics=placeholders(self.metrics))

    @property
    def total_loss(self) -> float:
        """The sum of the (host) losses, as the step back-propagated it."""
        return float(sum(self.losses.values()))


class _InRing:
    """A value kept in the ring buffer's row of its record."""


_IN_RING = _InRing()


def _is_tensor(v: Any) -> bool:
    return isinstance(v, torch.Tensor)


def _on_device(v: Any) -> bool:
    return _is_tensor(v) or v is _IN_RING


class StepRecords:
    """The records of the iterations since the last :meth:`take`: at most ``ring_rows`` of them
    (the trainer takes them at least every logging period), each with at most ``width`` device
    values."""

    def __init__(self, ring_rows: int, width: int = 16) -> None:
        self.ring_rows, self.width = ring_rows, width
        self._records: list[StepRecord] = []
        self._ring: torch.Tensor | None = None  # (ring_rows, width) float32
        self._slot: torch.Tensor | None = None  # (1,) long: the next row

    def __len__(self) -> int:
        return len(self._records)

    def append(self, record: StepRecord) -> None:
        tensors = record.tensors()
        if len(tensors) > self.width:
            raise ValueError(f"{len(tensors)} logged device values, at most {self.width}")
        if len(self._records) >= self.ring_rows:
            raise RuntimeError(f"more than {self.ring_rows} iterations without a flush")
        values = torch.stack([t.detach().float().reshape(()) for t in tensors])
        if self._ring is None or self._ring.device != values.device:
            self._ring = values.new_zeros(self.ring_rows, self.width)
            self._slot = torch.zeros(1, dtype=torch.long, device=values.device)
        row = torch.nn.functional.pad(values, (0, self.width - values.numel()))
        self._ring.index_copy_(0, self._slot, row[None])
        self._slot.add_(1)
        self._records.append(record.in_ring())

    def take(self) -> list[StepRecord]:
        """The records with host values, read in one device-to-host copy; empties the list."""
        records, self._records = self._records, []
        if not records:
            return []
        rows = self._ring[: len(records)].tolist()  # the one device-to-host read
        self._slot.zero_()
        return [r.on_host(iter(row)) for r, row in zip(records, rows, strict=True)]
