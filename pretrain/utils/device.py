"""Host-to-device copies that never make the host wait.

``t.to("cuda")`` of a host tensor is a blocking copy (a host sync: the launch queue drains), and a
non-blocking one from pageable memory is staged by the driver; from pinned memory it is a plain
asynchronous copy. Index tensors computed on the host (ShuffleBN's permutation, colour
augmentation's subsets) go to the device through :func:`to_device`.
"""

from __future__ import annotations

import torch

__all__ = ["to_device"]


def to_device(
    t: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``t`` (a host tensor) on ``device`` (and in ``dtype``), without a host sync: through
    pinned memory and a non-blocking copy on CUDA; the tensor itself (or a cast) elsewhere."""
    device = torch.device(device)
    if dtype is not None and dtype != t.dtype:
        t = t.to(dtype)
    if device.type == "cuda" and not t.is_cuda:
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device, non_blocking=True)
