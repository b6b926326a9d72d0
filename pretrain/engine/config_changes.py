"""A resume that changes the learning rate or the schedule's length (``--resume-with-changes``):
what the schedules then are, and the record each change leaves in the run directory.

Which keys may change is :data:`pretrain.config.resume.RESUME_WITH_CHANGES`.

After a change the schedules are the new config's, as functions of the iteration, from the
resume iteration on: a lower ``BASE_LR`` lowers the rest of the curve, a longer schedule
re-stretches the cosine over the new length, and beta's switch stays at its iteration. Only the
checkpoint's copies of the old learning rates are replaced (:func:`restart_lr_schedule`).

The record (:func:`record_config_changes`, main process, before the first changed iteration):
the previous ``config.yaml`` as ``config.before_change_<n>.yaml``, an entry in
``config_changes.json``, a ``config_change`` line in ``metrics.json``, then the new
``config.yaml``; a finished run's ``model_final.pth`` is kept as ``model_<iteration>.pth``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any

import torch
from detectron2.utils import comm
from fvcore.common.config import CfgNode

from pretrain.config.defaults import ConfigError
from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.run_setup import CONFIG_FILE

__all__ = [
    "CHANGES_FILE",
    "apply_config_changes",
    "check_changed_schedule",
    "checkpoint_iteration",
    "record_config_changes",
    "restart_lr_schedule",
]

logger = logging.getLogger(__name__)

CHANGES_FILE = "config_changes.json"
_FINAL = "model_final.pth"

Changes = Mapping[str, tuple[object, object]]  # {KEY: (saved value, new value)}


def checkpoint_iteration(output_dir: str) -> int:
    """The iteration saved in ``output_dir``'s last checkpoint (memory-mapped: no tensor read)."""
    with open(os.path.join(output_dir, "last_checkpoint")) as f:
        path = os.path.join(output_dir, f.read().strip())
    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    return int(state["iteration"])


def check_changed_schedule(output_dir: str, max_iter: int) -> None:
    """ConfigError unless a changed schedule of ``max_iter`` iterations goes on past the
    iteration at which the run resumes (checked before anything of the change is written)."""
    start = checkpoint_iteration(output_dir) + 1
    if max_iter <= start:
        raise ConfigError(
            f"SOLVER.MAX_ITER / SOLVER.EPOCHS: the changed schedule has {max_iter} iterations, and "
            f"{output_dir} resumes at iteration {start}: a resume can change the length of what "
            "is left, not end before it"
        )


def restart_lr_schedule(
    scheduler: torch.optim.lr_scheduler.LRScheduler, old_base_lr: float, base_lr: float
) -> tuple[float, float]:
    """Continue detectron2's ``LRMultiplier`` with the current config's schedule: the restored
    base learning rates scaled to ``base_lr`` and the resume iteration's rate computed again.
    Returns that rate (first group) before and after."""
    groups = scheduler.optimizer.param_groups
    before = float(groups[0]["lr"])
    scale = base_lr / old_base_lr
    scheduler.base_lrs = [b * scale for b in scheduler.base_lrs]
    for group, b in zip(groups, scheduler.base_lrs, strict=True):
        group["initial_lr"] = b
    lrs = scheduler.get_lr()
    for group, lr in zip(groups, lrs, strict=True):
        group["lr"] = lr
    scheduler._last_lr = list(lrs)  # what get_last_lr() reports, as step() would have set it
    return before, float(lrs[0])


def _previous_final(output_dir: str, iteration: int) -> str | None:
    """Keep a finished run's ``model_final.pth`` as ``model_<iteration>.pth``; its name, or None
    when the run was not finished."""
    with open(os.path.join(output_dir, "last_checkpoint")) as f:
        if f.read().strip() != _FINAL:
            return None
    name = f"model_{iteration:07d}.pth"
    target = os.path.join(output_dir, name)
    if not os.path.exists(target):
        try:
            os.link(os.path.join(output_dir, _FINAL), target)
        except OSError:  # no hard links here: a copy, complete or absent
            with open(os.path.join(output_dir, _FINAL), "rb") as src:
                atomic_write_bytes(target, src.read())
    return name


def _read_records(path: str) -> list[dict]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        records = json.load(f)
    if not isinstance(records, list):
        raise ConfigError(f"{path}: expected a JSON list of config changes")
    return records


def record_config_changes(
    cfg: CfgNode,
    changes: Changes,
    iteration: int,
    lr: tuple[float, float],
    max_iter: tuple[int, int],
) -> dict:
    """Write the record of a resume with ``changes`` (module docstring); ``iteration`` is the
    first with the new values, ``lr`` and ``max_iter`` are (before, after)."""
    out = cfg.OUTPUT_DIR
    path = os.path.join(out, CHANGES_FILE)
    records = _read_records(path)
    previous = f"config.before_change_{len(records) + 1}.yaml"
    shutil.copyfile(os.path.join(out, CONFIG_FILE), os.path.join(out, previous))
    with open(os.path.join(out, "last_checkpoint")) as f:
        resumed_from = f.read().strip()
    entry = {
        "iteration": iteration,
        "resumed_from": resumed_from,
        "changes": {k: {"from": was, "to": now} for k, (was, now) in changes.items()},
        "lr": {"from": lr[0], "to": lr[1]},
        "max_iter": {"from": max_iter[0], "to": max_iter[1]},
        "previous_config": previous,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    final = _previous_final(out, iteration - 1)
    if final:
        entry["previous_final"] = final
    atomic_write_bytes(path, (json.dumps([*records, entry], indent=2) + "\n").encode())
    line = {"iteration": iteration, "config_change": {**entry["changes"], "lr": entry["lr"]}}
    with open(os.path.join(out, "metrics.json"), "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    atomic_write_bytes(os.path.join(out, CONFIG_FILE), cfg.dump().encode())
    logger.info(
        f"resumed at iteration {iteration} with a changed config: "
        + "; ".join(f"{k} {was!r} -> {now!r}" for k, (was, now) in changes.items())
        + f"; lr at iteration {iteration} {lr[0]:.6g} -> {lr[1]:.6g}, max_iter {max_iter[0]} -> "
        f"{max_iter[1]} (recorded in {CHANGES_FILE}; the previous config is {previous})"
    )
    return entry


def apply_config_changes(trainer: Any, changes: Changes) -> None:
    """After ``trainer`` (built with the new config) loaded its checkpoint: continue with the
    new learning rates and record ``changes`` (main process)."""
    cfg, solver = trainer.cfg, trainer.cfg.SOLVER

    def saved(key: str) -> object:
        return changes[key][0] if key in changes else solver[key.split(".", 1)[1]]

    lr = restart_lr_schedule(trainer.scheduler, float(saved("SOLVER.BASE_LR")), solver.BASE_LR)
    old_max = int(saved("SOLVER.MAX_ITER")) or int(
        round(float(saved("SOLVER.EPOCHS")) * trainer.iters_per_epoch)
    )
    if comm.is_main_process():
        record_config_changes(cfg, changes, trainer.start_iter, lr, (old_max, trainer.max_iter))
