"""The process's global random-number generators as one checkpointable object.

Pretraining's trainer and the classification engine save them with every checkpoint and
restore them on resume (with data order and augmentations that depend only on (seed,
iteration), this makes a resumed run the run it would have been, even where a library draws
from a global generator).
"""

from __future__ import annotations

import random

import numpy as np
import torch

__all__ = ["RngStates"]


class RngStates:
    """``state_dict()`` / ``load_state_dict()`` of torch's CPU generator, Python's ``random``
    and NumPy's legacy global generator, as tensors and plain values (a ``weights_only``
    checkpoint loads them). fvcore's ``Checkpointer`` takes it as a checkpointable."""

    def state_dict(self) -> dict:
        version, state, gauss = random.getstate()
        _, keys, pos, has_gauss, cached = np.random.get_state()
        return {
            "torch": torch.get_rng_state(),
            "python": {"version": version, "state": list(state), "gauss": gauss},
            "numpy": torch.from_numpy(keys.astype(np.int64)),
            "numpy_position": [int(pos), int(has_gauss), float(cached)],
        }

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        py = state["python"]
        random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
        # checkpoints written before the position was saved: the next draw starts a new block
        pos, has_gauss, cached = state.get("numpy_position", (624, 0, 0.0))
        keys = state["numpy"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, int(pos), int(has_gauss), float(cached)))
