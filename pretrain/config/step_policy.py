"""How the one training step runs, chosen once from the config when the trainer is built.

* **eager** (the default, fastest on a CPU): colour ops on host-picked subsets, ``eigh`` with the
  logged-only ||Q||_* on logging iterations, a float learning rate;
* **graph-safe** (``SOLVER.STATIC_STEP``, implied by ``SOLVER.COMPILE.ENABLED``): the same device
  ops on the same shapes every step with no host read, as a CUDA graph or a compiled graph needs:
  device masks, the sync-free Jacobi norm on a GPU every step, a device learning rate, static DDP.

The eager step keeps the float learning rate because the device one rounds the update otherwise
(a multiply then a subtract, not one fused multiply-add), which would move the golden records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fvcore.common.config import CfgNode

__all__ = ["EAGER_STEP", "StepPolicy"]


@dataclass(frozen=True)
class StepPolicy:
    """The step's choices (module docstring), read from SOLVER.STATIC_STEP and SOLVER.COMPILE
    by :meth:`from_config`, which the trainer alone calls; it passes its policy down to the
    builders (model, optimiser, colour augmentation): alone, they build :data:`EAGER_STEP`'s."""

    graph_safe: bool = False
    pick: str = "subset"  # how colour ops pick their samples: "subset" (host) or "mask" (device)
    # what LOSS.NUCLEAR_NORM "auto" means in this step: "eigh", or "auto" (the norm's own choice)
    auto_nuclear_norm: str = "eigh"
    stats_every_step: bool = False  # the logged-only statistics (||Q||_*) on every iteration
    device_lr: bool = False  # the optimiser multiplies by a device copy of each group's lr
    ddp: dict[str, Any] = field(default_factory=dict)  # DistributedDataParallel's options
    compile: dict[str, Any] | None = None  # torch.compile's arguments, None: not compiled

    @classmethod
    def from_config(cls, cfg: CfgNode) -> StepPolicy:
        s = cfg.SOLVER
        if not (s.STATIC_STEP or s.COMPILE.ENABLED):
            return EAGER_STEP
        compiled = None
        if s.COMPILE.ENABLED:
            # whole graphs (a graph break is an error, not a silent fall back to eager), static
            # shapes; the modes are inductor's
            mode = s.COMPILE.MODE if s.COMPILE.BACKEND == "inductor" else None
            compiled = {"fullgraph": True, "dynamic": False, "backend": s.COMPILE.BACKEND}
            compiled["mode"] = mode
        return cls(
            graph_safe=True,
            pick="mask",
            auto_nuclear_norm="auto",  # the norm's own (Jacobi on a GPU, eigh on a CPU)
            stats_every_step=True,
            device_lr=True,
            # DDP's hooks fixed after the first step and the gradients in its buckets, so that
            # every later step runs the same reductions on the same buffers
            ddp={"static_graph": True, "gradient_as_bucket_view": True},
            compile=compiled,
        )

    def nuclear_norm(self, method: str) -> str:
        """The eigensolver of ||Q||_* in this step for LOSS.NUCLEAR_NORM ``method``."""
        return self.auto_nuclear_norm if method == "auto" else method

    def describe(self) -> str:
        """One line for the log: what this step does differently from the eager one."""
        if not self.graph_safe:
            return "eager step"
        how = "compiled" if self.compile else "static"
        extra = f" ({self.compile['backend']}, mode {self.compile['mode']})" if self.compile else ""
        return (
            f"{how} step{extra}: the same device ops every step (colour ops by device masks, "
            "the nuclear norm every step, device learning rate, static DDP)"
        )


EAGER_STEP = StepPolicy()  # the default step, and what a builder called alone builds for
