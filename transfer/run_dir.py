"""One discipline for the run directory of every evaluation tool.

A directory *holds a run* when it has a run's ``config.yaml``, ``args.json`` or results file, and
the run is *finished* when its results file is there. A later run leaves it as it is unless
``--resume`` (the same config, :func:`pretrain.config.resume.config_changes`) or ``--overwrite``
(delete :data:`RUN_FILES` and the tool's own) asks; otherwise it is refused in one line naming the
ways out. :meth:`RunDir.check` only reads; :meth:`RunDir.start` takes the directory's lock before
deleting anything; results are written atomically with the config and model that produced them.

A directory belongs to the tool that made it (:mod:`pretrain.utils.run_owner`): ``tool`` names
the tool of this ``RunDir``, which :meth:`RunDir.start` records, and :meth:`RunDir.check`
refuses a directory of another tool (a pretraining run given as a kNN's ``--output-dir``), with
or without ``--overwrite``: ``--overwrite`` and ``--resume`` apply to the tool's own runs only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

import yaml
from fvcore.common.config import CfgNode

from pretrain.config.resume import config_changes
from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.errors import LoracError
from pretrain.utils.locks import DirLock
from pretrain.utils.output_dir import check_output_dir
from pretrain.utils.run_owner import record_owner
from pretrain.utils.run_setup import ARGS_FILE, CONFIG_FILE, ENV_FILE
from pretrain.utils.yaml_files import read_yaml

__all__ = ["RESULTS_FILE", "RUN_FILES", "RunAction", "RunDir", "RunDirError", "add_run_dir_args"]

RESULTS_FILE = "results.json"
STAGE_RESULTS = "stage_results.json"  # one finished stage of a sweep, in its own folder
# What any tool's run leaves in its directory (detectron2's writers included): the files
# ``--overwrite`` deletes before a fresh start, besides each tool's own (``RunDir.own``).
RUN_FILES = (
    CONFIG_FILE,
    ENV_FILE,
    ARGS_FILE,
    RESULTS_FILE,
    "last_checkpoint",
    "model_*.pth",
    "metrics.json",
    "log.txt*",
    "events.out.tfevents.*",
    "wandb",  # --log-to's stores (pretrain/engine/writers.py)
    "mlruns",
)


class RunDirError(LoracError):
    """A run directory that holds another run (the message names it and the ways out)."""


class RunAction(Enum):
    FRESH = "fresh"  # nothing there: a new run
    RESUME = "resume"  # an unfinished run with the same config: continue it
    OVERWRITE = "overwrite"  # a previous run, replaced on request
    DONE = "done"  # a finished run and --resume: nothing left to do


def add_run_dir_args(parser: argparse.ArgumentParser) -> None:
    """``--overwrite``: the one way to replace the run an output directory holds."""
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run the output directory holds: its config, results, checkpoints and "
        "logs are deleted first (without it, a directory holding a run is refused)",
    )


@dataclass
class RunDir:
    """The run directory ``path`` of the tool ``tool`` (a key of
    :data:`pretrain.utils.run_owner.KINDS`; empty only for :meth:`restart_hint`); ``what`` names
    it in messages, ``results`` is the file a finished run leaves, ``own`` the tool's other globs
    ``--overwrite`` deletes, ``may_change`` the keys a resume may change besides pretraining's."""

    path: str
    what: str = "--output-dir"
    results: str = RESULTS_FILE
    own: tuple[str, ...] = ()
    may_change: tuple[str, ...] = ()
    resumable: bool = False
    tool: str = ""

    def _file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def holds_run(self) -> bool:
        return any(os.path.exists(self._file(n)) for n in (CONFIG_FILE, ARGS_FILE, self.results))

    def finished(self) -> bool:
        return os.path.isfile(self._file(self.results))

    def _ways_out(self) -> str:
        resume = "continue it with --resume (same config), " if self.resumable else ""
        return f"{resume}replace it with --overwrite, or choose another {self.what}"

    def check(
        self, resume: bool = False, overwrite: bool = False, cfg: CfgNode | None = None
    ) -> RunAction:
        """What this run does with the directory (reads only); :class:`RunDirError` when it
        cannot be written, would touch another run unasked, or a resume changes ``cfg``."""
        if resume and overwrite:
            raise RunDirError("give --resume or --overwrite, not both")
        if not self.tool:
            raise TypeError("RunDir.check needs the tool whose run directory it is (tool=...)")
        check_output_dir(self.path, self.what, RunDirError, owner=self.tool)
        if not self.holds_run():
            return RunAction.FRESH
        if overwrite:
            return RunAction.OVERWRITE
        state = "a finished run" if self.finished() else "an unfinished run"
        if not resume:
            raise RunDirError(
                f"{self.what} {self.path} holds {state} ({self._present()}); {self._ways_out()}"
            )
        if cfg is not None:
            self._check_same_config(cfg)
        return RunAction.DONE if self.finished() else RunAction.RESUME

    def restart_hint(self) -> str:
        """How a run of this tool that stopped at once (a Ctrl-C outside its training loop) goes
        on, from what the directory holds now."""
        tag = self._file("last_checkpoint")
        if self.finished():
            return f"{self.what} {self.path} holds the finished run ({self.results})"
        if self.resumable and os.path.isfile(tag):
            with open(tag) as f:
                checkpoint = self._file(f.read().strip())
            return f"the same command with --resume continues from {checkpoint}"
        if self.resumable and self._progress_below():
            return (
                "the same command with --resume continues from what it finished (a sweep's "
                f"stages and checkpoints in {self.path})"
            )
        if self.holds_run():
            return (
                f"nothing to resume; the same command with --overwrite starts again ({self.what} "
                f"{self.path} holds the unfinished run)"
            )
        return "nothing was written; the same command starts again"

    def _progress_below(self) -> bool:
        """Whether a sweep's stage (one lr, one search point) in a folder below finished or
        left a checkpoint."""
        found = (os.path.join(self.path, "**", n) for n in (STAGE_RESULTS, "last_checkpoint"))
        return any(glob.glob(pattern, recursive=True) for pattern in found)

    def _present(self) -> str:
        names = [n for n in (self.results, CONFIG_FILE, ARGS_FILE) if os.path.exists(self._file(n))]
        return ", ".join(names)

    def _check_same_config(self, cfg: CfgNode) -> None:
        saved_path = self._file(CONFIG_FILE)
        if not os.path.isfile(saved_path):
            return
        saved = read_yaml(saved_path, "saved config", RunDirError) or {}
        changes = config_changes(saved, cfg, self.may_change)
        if changes:
            raise RunDirError(
                f"{self.what} {self.path} holds a run trained with another config: "
                + "; ".join(changes)
                + f". Resume with the saved values ({saved_path}), replace the run with "
                f"--overwrite, or choose another {self.what}"
            )

    def start(self, action: RunAction) -> DirLock:
        """Take the directory's lock (held until the process ends) and, for
        :attr:`RunAction.OVERWRITE`, delete the previous run's files. Main process only."""
        lock = DirLock(self.path, self.what).acquire()
        record_owner(self.path, self.tool)
        if action is RunAction.OVERWRITE:
            for pattern in (*RUN_FILES, *self.own):
                for path in glob.glob(self._file(pattern)):
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path)
                    else:
                        os.unlink(path)
        return lock

    def write_results(
        self, results: Mapping, cfg: CfgNode | Mapping | None = None, **fields: object
    ) -> str:
        """Write the results file atomically: ``fields`` (e.g. the model's name and weights),
        ``results`` and the full ``config``; returns its path."""
        config = yaml.safe_load(cfg.dump()) if isinstance(cfg, CfgNode) else cfg
        payload = {**fields, "results": dict(results), "config": config}
        path = self._file(self.results)
        os.makedirs(self.path, exist_ok=True)
        text = json.dumps(payload, indent=2, default=_plain)
        atomic_write_bytes(path, (text + "\n").encode())
        return path


def _plain(value: object) -> object:
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return list(value)
    return str(value)
