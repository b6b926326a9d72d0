"""Command-line pieces shared by the classification tools (:mod:`transfer.cli`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from detectron2.utils import comm
from fvcore.common.config import CfgNode

from pretrain.engine.writers import add_log_to_arg, log_to_names
from pretrain.utils.output_dir import check_output_dir
from pretrain.utils.run_owner import config_kind
from pretrain.utils.run_setup import setup_run
from transfer.checkpoint.provenance import checkpoint_method, run_label
from transfer.run_dir import RESULTS_FILE, RunAction, RunDir, RunDirError, add_run_dir_args
from transfer.tables import RowOwner, check_row, update_table

from .backbone import ARCHS, EvalBackbone, load_eval_backbone
from .config import load_config
from .engine import resolve_device

__all__ = [
    "add_model_args",
    "key_value",
    "model_from_args",
    "model_name",
    "RESUME_MAY_CHANGE",
    "ROW_CLASH_HINT",
    "row_owner",
    "RunStart",
    "check_table_row",
    "start_run",
    "table_dir",
    "write_table_row",
]

# What a resumed classification run may change besides pretraining's list: how it is run.
RESUME_MAY_CHANGE = ("DEVICE", "DATA.NUM_WORKERS", "LOG_PERIOD", "TEST.EVAL_PERIOD")
# The end of a RowClashError: how a row of the same name holding another model's is resolved.
ROW_CLASH_HINT = "give this model another --name, or pass --replace-row to replace that row"


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint PATH`` | ``--random-init ARCH``, ``--init-seed``, ``--name``, dirs."""
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--checkpoint",
        help="pretrained ResNet weights in any layout of docs/checkpoints.md: this project's, "
        "MoCo/LORAC, torchvision, SwAV, DINO, solo-learn, VISSL, converted SimCLR/BYOL, "
        "detectron2 .pkl",
    )
    which.add_argument("--random-init", choices=list(ARCHS), help="random baseline of this arch")
    parser.add_argument("--init-seed", type=int, default=0, help="seed of --random-init")
    parser.add_argument(
        "--name", default="", help="row name in the tables (default: the checkpoint's run "
        "directory for a run's model_*.pth, else its file name)",
    )  # fmt: skip
    parser.add_argument(
        "--replace-row", action="store_true", help="replace a table row of the same name that "
        "holds another model's results (rows are keyed by a hash of the weights)",
    )  # fmt: skip
    parser.add_argument(
        "--output-dir", required=True, help="run directory (logs, config, results.json); one "
        "run each: a directory holding a run is refused (see --overwrite)",
    )  # fmt: skip
    add_run_dir_args(parser)
    add_log_to_arg(parser)
    parser.add_argument(
        "--table-dir", default="", help="where the Markdown/CSV tables go (default: output dir); "
        "runs of other models with the same table dir add rows",
    )  # fmt: skip


def key_value(text: str) -> tuple[str, str]:
    """argparse type of ``KEY=VALUE`` options."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def model_from_args(args: argparse.Namespace) -> EvalBackbone:
    """The backbone of ``--checkpoint`` / ``--random-init``; prints which layout was read."""
    backbone = load_eval_backbone(args.checkpoint, args.random_init, args.init_seed)
    if comm.is_main_process():
        print(f"backbone: {backbone.description}")
    return backbone


def model_name(args: argparse.Namespace) -> str:
    """``--name``, else ``random-init <arch>`` or the checkpoint's
    :func:`~transfer.checkpoint.provenance.run_label`."""
    if args.name:
        return args.name
    if args.random_init:
        return f"random-init {args.random_init}"
    return run_label(args.checkpoint)


def row_owner(args: argparse.Namespace, backbone: EvalBackbone) -> RowOwner:
    """Whose results rows are: :func:`model_name`, its run's method and the hash of the weights
    evaluated, which keys the rows."""
    method = checkpoint_method(args.checkpoint) if args.checkpoint else ""
    return RowOwner(model_name(args), method, backbone.weights)


def table_dir(args: argparse.Namespace) -> str:
    return args.table_dir or args.output_dir


def check_table_row(
    args: argparse.Namespace,
    owner: RowOwner,
    file: str,
    key: str,
    sources: Mapping[str, str],
) -> None:
    """Refuse, before any work, a run whose row in the table ``file`` would meet a row of that
    name holding another model's results, or figures of other data in ``sources``' columns."""
    path = os.path.join(table_dir(args), file)
    cells = owner.cells(key)
    check_row(path, key, cells, replace=args.replace_row, hint=ROW_CLASH_HINT, sources=sources)


def write_table_row(
    args: argparse.Namespace,
    owner: RowOwner,
    file: str,
    columns: Sequence[str],
    cells: dict[str, object],
    title: str,
    sources: Mapping[str, str],
) -> str:
    """Add or update ``owner``'s row in the table ``file`` of the table dir
    (:func:`transfer.tables.update_table`); returns the CSV path."""
    path = os.path.join(table_dir(args), file)
    row = {**cells, **owner.cells(columns[0])}
    keyed = {"replace": args.replace_row, "hint": ROW_CLASH_HINT, "sources": sources}
    update_table(path, columns, row, title, **keyed)
    return path


@dataclass
class RunStart:
    """What :func:`start_run` set up (``backbone``, ``data`` and ``owner`` stay None when the
    run is :attr:`done`)."""

    cfg: CfgNode
    device: torch.device
    run_dir: RunDir
    action: RunAction
    backbone: EvalBackbone | None = None
    data: Any = None
    owner: RowOwner | None = None
    log_to: tuple[str, ...] = ()  # --log-to's optional writers

    @property
    def done(self) -> bool:
        return self.action is RunAction.DONE


def start_run(
    defaults: CfgNode,
    args: argparse.Namespace,
    extra_opts: Sequence[str] = (),
    own: Sequence[str] = (),
    results: str = RESULTS_FILE,
    prepare: Callable[[CfgNode], Any] | None = None,
    check: Callable[[RunStart], None] | None = None,
    tool: str = "",
) -> RunStart:
    """The start every classification tool shares. The config (``--config-file``, then
    ``extra_opts``, ``OUTPUT_DIR`` and ``--device``), the run directory (``own``: the files
    ``--overwrite`` deletes), the data (``prepare(cfg)``) and the backbone are read and
    ``check(start)`` run before anything is written, so a mistake leaves no directory behind;
    then the directory's lock and the run setup (nothing of it for a finished run). ``tool``:
    the tool whose run directory it is (:mod:`pretrain.utils.run_owner`; default: the kind of
    run ``defaults`` configure)."""
    tool_opts = [*extra_opts, "OUTPUT_DIR", args.output_dir]
    if args.device:
        tool_opts += ["DEVICE", args.device]
    cfg = load_config(defaults, args.config_file, args.opts, tool_opts)
    device = resolve_device(cfg.DEVICE)
    resume = bool(getattr(args, "resume", False))
    run_dir = RunDir(
        cfg.OUTPUT_DIR, "--output-dir", results, tuple(own), RESUME_MAY_CHANGE,
        resumable=hasattr(args, "resume"), tool=tool or config_kind(defaults) or "",
    )  # fmt: skip
    action = run_dir.check(resume, args.overwrite, cfg)
    check_output_dir(args.table_dir, "--table-dir", RunDirError, optional=True)  # "": output dir
    start = RunStart(cfg, device, run_dir, action, log_to=log_to_names(args.log_to))
    if start.done:
        if comm.is_main_process():
            print(f"{run_dir.path} holds a finished run ({run_dir.results}): nothing left to do")
        return start
    start.data = prepare(cfg) if prepare else None
    start.backbone = model_from_args(args)
    start.owner = row_owner(args, start.backbone)
    if check:
        check(start)
    if comm.is_main_process():
        run_dir.start(action)
    comm.synchronize()
    setup_run(cfg)
    return start
