"""What a resumed run may change: the keys that alter neither the trained state nor the data order,
and, when asked for explicitly, the learning rate and the schedule's length.

Resuming with another value of any other key (a queue size, a seed, the data) would continue a
different run from this one's state: :func:`check_resume_config` refuses it, naming each key with
both values. The keys of :data:`RESUME_WITH_CHANGES` may change with ``--resume-with-changes``
only, and each change is recorded (:mod:`pretrain.engine.config_changes`).
"""

from __future__ import annotations

import os
from collections.abc import Collection

import yaml
from fvcore.common.config import CfgNode

from pretrain.utils.errors import ConfigError
from pretrain.utils.run_setup import CONFIG_FILE
from pretrain.utils.yaml_files import read_yaml

__all__ = [
    "RESUME_FLAG",
    "RESUME_FLAG_HELP",
    "RESUME_MAY_CHANGE",
    "RESUME_WITH_CHANGES",
    "changed_values",
    "check_resume_config",
    "config_changes",
    "read_saved_config",
]

# How a run is watched, not what it computes; and how the same computation runs (the rounding
# only, as cudnn's benchmark). docs/layout.md lists them.
RESUME_MAY_CHANGE = (
    "OUTPUT_DIR",
    "SOLVER.LOG_PERIOD",
    "SOLVER.CHECKPOINT_PERIOD",
    "SOLVER.MAX_TO_KEEP",
    "DATALOADER.NUM_WORKERS",
    "DIST.TIMEOUT_MINUTES",
    "CUDNN_BENCHMARK",
    "SOLVER.STATIC_STEP",
    "SOLVER.COMPILE.ENABLED",
    "SOLVER.COMPILE.MODE",
    "SOLVER.COMPILE.BACKEND",
    "LOSS.NUCLEAR_NORM",
    "TEST.KNN_PERIOD",
    "TEST.KNN_BATCH_SIZE",
    "TEST.KNN_TRAIN_IMAGES",
    "TEST.KNN_TEST_IMAGES",
    "TEST.KNN_ROOT",
)

# What a resume may change when asked to with RESUME_FLAG: the learning rate's scale and end, and
# the schedule's length (docs/layout.md and README say what the schedule then is).
RESUME_WITH_CHANGES = ("SOLVER.BASE_LR", "SOLVER.FINAL_LR", "SOLVER.MAX_ITER", "SOLVER.EPOCHS")
RESUME_FLAG = "--resume-with-changes"
RESUME_FLAG_HELP = (
    f"resume although {', '.join(RESUME_WITH_CHANGES)} changed (a lower lr after a divergence, "
    "a longer or shorter schedule, a finished run extended); the schedule is then the new "
    "config's from the resume iteration on, and each change is recorded in the run "
    "(config_changes.json, metrics.json, the previous config.yaml kept)"
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


def changed_values(
    saved: dict, cfg: CfgNode, may_change: Collection[str] = frozenset()
) -> dict[str, tuple[object, object]]:
    """``{KEY: (saved value, value now)}`` for every key whose value differs (keys of either
    side; ``"<absent>"`` for a missing one), except :data:`RESUME_MAY_CHANGE` and
    ``may_change``."""
    old, new = _flat(saved), _flat(yaml.safe_load(cfg.dump()))
    changes = {}
    for key in sorted(old.keys() | new.keys()):
        was, now = old.get(key, "<absent>"), new.get(key, "<absent>")
        if key not in RESUME_MAY_CHANGE and key not in may_change and was != now:
            changes[key] = (was, now)
    return changes


def config_changes(
    saved: dict, cfg: CfgNode, may_change: Collection[str] = frozenset()
) -> list[str]:
    """``"KEY: saved X, now Y"`` for every key :func:`changed_values` finds."""
    return _described(changed_values(saved, cfg, may_change))


def _described(changes: dict[str, tuple[object, object]]) -> list[str]:
    return [f"{key}: saved {was!r}, now {now!r}" for key, (was, now) in changes.items()]


def read_saved_config(output_dir: str, config_file: str = CONFIG_FILE) -> dict | None:
    """The saved ``config.yaml`` of a run to resume (a checkpoint and the file are there), as a
    dict; ``None`` when there is nothing to resume."""
    saved_path = os.path.join(output_dir, config_file)
    if not (
        os.path.isfile(os.path.join(output_dir, "last_checkpoint")) and os.path.isfile(saved_path)
    ):
        return None
    saved = read_yaml(saved_path, "saved config")  # a hand-edited tab: file, line and column
    if saved is not None and not isinstance(saved, dict):
        raise ConfigError(f"{saved_path}: expected a YAML mapping of config keys")
    return saved or {}


def check_resume_config(
    cfg: CfgNode, with_changes: bool = False, config_file: str = CONFIG_FILE
) -> dict[str, tuple[object, object]]:
    """Raise :class:`ConfigError` when ``cfg.OUTPUT_DIR`` holds a run to resume and ``cfg``
    differs from its saved config in a key outside :data:`RESUME_MAY_CHANGE`, unless every such
    key is one of :data:`RESUME_WITH_CHANGES` and ``with_changes``. Returns the changes allowed,
    ``{KEY: (saved, now)}``; writes nothing."""
    out = cfg.OUTPUT_DIR
    saved = read_saved_config(out, config_file)
    if saved is None:
        return {}
    changes = changed_values(saved, cfg)
    allowed = {k: v for k, v in changes.items() if k in RESUME_WITH_CHANGES}
    if changes and (not with_changes or len(allowed) < len(changes)):
        saved_path = os.path.join(out, config_file)
        listed = "; ".join(_described(changes))
        if len(allowed) == len(changes):
            how = (
                f"To resume with the new values pass {RESUME_FLAG} (each change is recorded in "
                f"the run), or resume with the saved values (they are in {saved_path})"
            )
        else:
            how = (
                f"Resume with the saved values (they are in {saved_path}) or start afresh with "
                f"another OUTPUT_DIR; {RESUME_FLAG} allows changes of "
                f"{', '.join(RESUME_WITH_CHANGES)} only"
            )
        raise ConfigError(
            f"{out} holds a run to resume, trained with another config: {listed}. {how}"
        )
    return allowed
