"""An estimate of the GPU memory a training step of a config needs per process, from a CPU
forward: no GPU involved, so it is an **estimate** (docs/cluster.md, "One, two, four or eight
GPUs").

The tensors autograd saves for the backward are what grows with the batch. They are counted with
``torch.autograd.graph.saved_tensors_hooks`` on the model's real training forward (all views at
their real sizes, the key encoder, the loss), on the CPU at batches of 2 and 4 under the config's
autocast (bfloat16 stores activations in 2 bytes, as on the GPU), each storage once: the
difference / 2 is the bytes per image, the rest is the step's fixed part (the copy of the queues
the loss reads). The model's state (both encoders, the optimizer's momentum and the gradients,
the queues) is counted from its tensors. Left out: the CUDA context and cuDNN's workspaces (about
0.5-1 GiB), the caching allocator's slack, and the backward's transient buffers, so a real peak
is higher; docs/performance.md's measured peaks of the IN-1K LORAC step (6.1 GiB at 32 images
per GPU, 11.6 at 64 on an H200) are the check.

``python -m pretrain.engine.memory CONFIG [KEY VALUE ...]`` prints the estimate.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import NamedTuple

import torch
from fvcore.common.config import CfgNode

from pretrain.config.defaults import load_config
from pretrain.data.loader import augment_views_on_device, build_batch_augment
from pretrain.modeling import build_model

__all__ = ["MemoryEstimate", "estimate_memory", "saved_bytes"]

GIB = 2**30


class MemoryEstimate(NamedTuple):
    activation_bytes_per_image: float  # saved for the backward, per image of the batch
    state_bytes: int  # parameters, gradients, momentum buffers, queues
    step_bytes: float = 0.0  # saved for the backward whatever the batch (the queues' copy)

    def per_process(self, images: int) -> float:
        """Estimated bytes one process holds at ``images`` images per process."""
        return self.state_bytes + self.step_bytes + images * self.activation_bytes_per_image


def saved_bytes(
    fn: object, *args: object, exclude: Iterable[torch.Tensor] = ()
) -> tuple[object, int]:
    """``fn(*args)`` and the bytes of the distinct storages autograd saved for its backward,
    leaving out those of ``exclude`` (the parameters: held anyway)."""
    seen: dict[int, int] = {}
    held = {t.untyped_storage().data_ptr() for t in exclude}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in held:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)  # type: ignore[operator]
    return out, sum(seen.values())


def estimate_memory(cfg: CfgNode) -> MemoryEstimate:
    """:class:`MemoryEstimate` of ``cfg``'s training step (one process, on the CPU)."""
    two, state = _saved_in_step(cfg, 2)
    four, _ = _saved_in_step(cfg, 4)
    per_image = (four - two) / 2
    return MemoryEstimate(per_image, state, two - 2 * per_image)


def _saved_in_step(cfg: CfgNode, batch: int) -> tuple[int, int]:
    """(bytes saved for the backward by a training forward of ``batch`` images, state bytes)."""
    cfg = cfg.clone()
    cfg.defrost()
    cfg.MODEL.DEVICE, cfg.SOLVER.IMS_PER_BATCH = "cpu", batch
    cfg.MODEL.QUEUE_SIZE = cfg.MODEL.QUEUE_SIZE // batch * batch
    cfg.MODEL.SHUFFLE_BN, cfg.MODEL.KEY_BN_SPLITS = False, 1  # the grouping saves nothing more
    torch.manual_seed(0)
    model = build_model(cfg)
    model.train()
    views = [torch.randint(0, 256, (batch, 3, s, s), dtype=torch.uint8) for s in model.view_sizes]
    data = {"views": views, "seeds": torch.arange(batch), "iteration": 0}
    data = augment_views_on_device(data, build_batch_augment(cfg), "cpu", apply_color=True)
    amp = cfg.SOLVER.AMP
    dtype = getattr(torch, amp.PRECISION) if amp.ENABLED else torch.float32
    with torch.autocast("cpu", dtype=dtype, enabled=amp.ENABLED):
        held = [*model.parameters(), *model.buffers()]
        _, activations = saved_bytes(model, data, exclude=held)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    trained = sum(
        p.numel() * p.element_size() for p in model.encoder_q.parameters() if p.requires_grad
    )
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())  # queues, BN stats
    return activations, params + 2 * trained + buffers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg = load_config(argv[0], [*argv[1:], "DATASETS.ROOT", "unused"])
    est = estimate_memory(cfg)
    per = est.activation_bytes_per_image
    print(
        f"{argv[0]}: {per / 2**20:.0f} MiB of saved activations per image, "
        f"{(est.state_bytes + est.step_bytes) / GIB:.2f} GiB of state and fixed step part; "
        "per process (estimate): "
        + ", ".join(f"{b} images {est.per_process(b) / GIB:.1f} GiB" for b in (16, 32, 64, 128))
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
