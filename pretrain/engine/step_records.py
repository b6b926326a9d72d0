"""The iterations not yet logged: their device values, kept without a host sync until the trainer
reads them all at once at its logging period (:meth:`StepRecords.take`).

Eager step: each record keeps references to its step's loss and metric tensors. Static step
(SOLVER.STATIC_STEP): each step's values are copied into a row of a device ring buffer whose row
index is itself a device counter, so that every step runs the same two ops on the same tensors
and nothing holds on to the step's own outputs (a CUDA graph replay, torch.compile's included,
overwrites its outputs at the next replay).
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
    """The records of the iterations since the last :meth:`take` (at most ``ring_rows`` of them
    with a ring buffer: the trainer takes them at least every logging period)."""

    def __init__(self, ring_rows: int | None = None) -> None:
        self.ring_rows = ring_rows
        self._records: list[StepRecord] = []
        self._ring: torch.Tensor | None = None  # (ring_rows, values per step) float32
        self._slot: torch.Tensor | None = None  # (1,) long: the next row

    def __len__(self) -> int:
        return len(self._records)

    def append(self, record: StepRecord) -> None:
        if self.ring_rows is None:
            self._records.append(record)
            return
        values = torch.stack([t.detach().float().reshape(()) for t in record.tensors()])
        if self._ring is None or self._ring.shape[1] != values.numel():
            if self._records:
                raise RuntimeError(
                    f"iteration {record.iteration} logs {values.numel()} device values, the "
                    f"iterations before it {self._ring.shape[1]}: the static step logs the "
                    "same values every iteration"
                )
            self._ring = values.new_zeros(self.ring_rows, values.numel())
            self._slot = torch.zeros(1, dtype=torch.long, device=values.device)
        if len(self._records) >= self.ring_rows:
            raise RuntimeError(f"more than {self.ring_rows} iterations without a flush")
        self._ring.index_copy_(0, self._slot, values[None])
        self._slot.add_(1)
        self._records.append(record.in_ring())

    def take(self) -> list[StepRecord]:
        """The records with host values, read in one device-to-host copy; empties the list."""
        records, self._records = self._records, []
        if not records:
            return []
        if self.ring_rows is None:
            device = torch.stack([t.double() for r in records for t in r.tensors()])
        else:  # float32 values, exact in float64 as above
            device = self._ring[: len(records)].double().reshape(-1)
            self._slot.zero_()
        values = iter(device.tolist() if device.numel() else [])  # the one device-to-host read
        return [r.on_host(values) for r in records]
