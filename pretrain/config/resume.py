"""What a resumed run may change: the keys that alter neither the trained state nor the data order.

A run resumes from ``OUTPUT_DIR/last_checkpoint``; its ``config.yaml`` is the config that trained
it. Resuming with another value of any other key (a queue size, a learning rate, a seed, the
number of iterations, the data) would continue a different run from this one's state, and
fvcore would only log a skipped tensor: :func:`check_resume_config` refuses it, naming each key
with both values.
"""

from __future__ import annotations

import os
from collections.abc import Collection

import yaml
from fvcore.common.config import CfgNode

from pretrain.utils.errors import ConfigError
from pretrain.utils.run_setup import CONFIG_FILE

__all__ = ["RESUME_MAY_CHANGE", "check_resume_config", "config_changes"]

# Logging, checkpointing, loading speed, monitoring, timeouts: how a run is watched, not what it
# computes (docs/layout.md lists them).
RESUME_MAY_CHANGE = (
    "OUTPUT_DIR",
    "SOLVER.LOG_PERIOD",
    "SOLVER.CHECKPOINT_PERIOD",
    "SOLVER.MAX_TO_KEEP",
    "DATALOADER.NUM_WORKERS",
    "DIST.TIMEOUT_MINUTES",
    "CUDNN_BENCHMARK",
    "TEST.KNN_PERIOD",
    "TEST.KNN_BATCH_SIZE",
    "TEST.KNN_TRAIN_IMAGES",
    "TEST.KNN_TEST_IMAGES",
    "TEST.KNN_ROOT",
)


def _flat(node: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        else:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def config_changes(
    saved: dict, cfg: CfgNode, may_change: Collection[str] = frozenset()
) -> list[str]:
    """``"KEY: saved X, now Y"`` for every key whose value differs (keys of either side),
    except :data:`RESUME_MAY_CHANGE` and a tool's own ``may_change``."""
    old, new = _flat(saved), _flat(yaml.safe_load(cfg.dump()))
    changes = []
    for key in sorted(old.keys() | new.keys()):
        was, now = old.get(key, "<absent>"), new.get(key, "<absent>")
        if key not in RESUME_MAY_CHANGE and key not in may_change and was != now:
            changes.append(f"{key}: saved {was!r}, now {now!r}")
    return changes


def check_resume_config(cfg: CfgNode, config_file: str = CONFIG_FILE) -> None:
    """Raise :class:`ConfigError` when ``cfg.OUTPUT_DIR`` holds a checkpoint to resume from and
    ``cfg`` differs from the saved ``config.yaml`` in a key outside :data:`RESUME_MAY_CHANGE`.
    Nothing is checked (nor written) when there is no checkpoint or no saved config."""
    out = cfg.OUTPUT_DIR
    saved_path = os.path.join(out, config_file)
    if not (os.path.isfile(os.path.join(out, "last_checkpoint")) and os.path.isfile(saved_path)):
        return
    with open(saved_path) as f:
        saved = yaml.safe_load(f) or {}
    changes = config_changes(saved, cfg)
    if changes:
        raise ConfigError(
            f"{out} holds a run to resume, trained with another config: "
            + "; ".join(changes)
            + ". Resume with the saved values (they are in "
            + f"{saved_path}) or start afresh with another OUTPUT_DIR"
        )
