"""Setting up a pretraining run from the command line (detectron2-style)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
from detectron2.engine import default_argument_parser
from detectron2.utils import comm
from fvcore.common.config import CfgNode

from pretrain.config.defaults import ConfigError, load_config
from pretrain.config.resume import check_resume_config
from pretrain.config.world_size import resolve_world_size
from pretrain.data.datasets import FASHION_MNIST, read_class_list
from pretrain.engine.checkpoint import check_last_checkpoint
from pretrain.evaluation.knn_monitor import check_knn_root
from pretrain.modeling.encoder import strided_convs_on_1px_maps
from pretrain.utils.distributed import dist_env_from_environ, maybe_init_distributed
from pretrain.utils.errors import DatasetError
from pretrain.utils.locks import DirLock
from pretrain.utils.output_dir import check_output_dir
from pretrain.utils.run_owner import PRETRAINING
from pretrain.utils.run_setup import setup_run

__all__ = [
    "argument_parser",
    "begin_run",
    "checked_config",
    "check_class_folders",
    "check_cpu_bfloat16",
    "check_data",
    "check_data_root",
    "check_device",
    "check_run_dir",
    "load_args_config",
    "setup",
]


_EPILOG = """examples:
  one machine, 8 GPUs:
    %(prog)s --config-file configs/pretrain/in1k_r50_lorac_200ep.yaml --num-gpus 8 \\
        DATASETS.ROOT /data/imagenet/train TEST.KNN_ROOT /data/imagenet \\
        OUTPUT_DIR output/lorac_in1k
  overrides (any key of pretrain/config/defaults.py):
    %(prog)s --config-file CFG SOLVER.BASE_LR 0.6 LOSS.BETA inf MODEL.DEVICE cpu
  two machines:
    (machine 0) %(prog)s --machine-rank 0 --num-machines 2 --dist-url tcp://HOST:PORT ...
    (machine 1) %(prog)s --machine-rank 1 --num-machines 2 --dist-url tcp://HOST:PORT ...

A run resumes from OUTPUT_DIR/last_checkpoint when there is one (no flag needed; a finished run
is not trained again); use a new OUTPUT_DIR to start afresh. To evaluate a checkpoint, use
tools/knn_eval.py or tools/linear_probe.py.
"""


def argument_parser(
    description: str, parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser
) -> argparse.ArgumentParser:
    """detectron2's launch options and trailing KEY VALUE overrides; not its --resume (a run
    always resumes) nor --eval-only (pretraining has nothing to evaluate alone)."""
    d2 = default_argument_parser()
    p = parser_class(
        description=description,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config-file", default="", metavar="FILE", help="pretraining config (YAML)")
    p.add_argument(
        "--num-gpus", type=int, default=1, help="processes per machine (one per GPU; gloo on CPU)"
    )
    p.add_argument("--num-machines", type=int, default=1, help="number of machines")
    p.add_argument("--machine-rank", type=int, default=0, help="this machine's rank (0-based)")
    p.add_argument(
        "--dist-url",
        default=d2.get_default("dist_url"),
        help="torch.distributed init URL (default: detectron2's, a port derived from the uid)",
    )
    p.add_argument(
        "opts",
        default=None,
        nargs=argparse.REMAINDER,
        help="config overrides as KEY VALUE pairs, e.g. SOLVER.BASE_LR 0.6 OUTPUT_DIR out/x",
    )
    return p


def _normalise_opts(opts: list[str]) -> list[str]:
    # yacs parses values with literal_eval, which has no 'inf'; 1e999 evaluates to inf.
    return [{"inf": "1e999", "-inf": "-1e999"}.get(o, o) for o in opts]


def load_args_config(args: argparse.Namespace) -> CfgNode:
    """The validated, frozen config of ``--config-file`` and the trailing overrides."""
    return load_config(args.config_file, _normalise_opts(list(args.opts)))


def check_device(device: str) -> None:
    """Refuse ``MODEL.DEVICE cuda`` where no CUDA device is visible, rather than train for days
    on CPU at a hundredth of the speed."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "MODEL.DEVICE = 'cuda' but CUDA is not visible to this process (no GPU, no driver, or "
            "CUDA_VISIBLE_DEVICES hides them): run where a GPU is visible, or set MODEL.DEVICE "
            "cpu to train on the CPU"
        )


def check_data_root(root: str) -> None:
    """Refuse a ``DATASETS.ROOT`` that is no directory before OUTPUT_DIR is created (a wrong
    path, the commonest mistake, would leave a run directory behind)."""
    if not os.path.isdir(root):
        raise DatasetError(f"DATASETS.ROOT = {root!r}: no such directory")


def check_class_folders(roots: Sequence[str], class_list: str, key: str) -> None:
    """DatasetError unless the class list (setting ``key``) reads and every root of ``roots``
    has a folder for each of its classes (only folder names are listed)."""
    try:
        names = read_class_list(class_list)
    except DatasetError as e:
        raise DatasetError(f"{key}: {e}") from None
    for root in roots:
        with os.scandir(root) as entries:
            folders = {e.name for e in entries if e.is_dir()}
        missing = [n for n in names if n not in folders]
        if missing:
            raise DatasetError(
                f"{root}: {len(missing)} classes of the class list have no folder, e.g. "
                f"{missing[:5]} ({key} = {class_list!r})"
            )


def check_data(cfg: CfgNode) -> None:
    """The data a run reads is there: ``DATASETS.ROOT``, the kNN monitor's ``train/`` and
    ``val/``, and a folder in each for every class of ``DATASETS.CLASS_LIST``."""
    check_data_root(cfg.DATASETS.ROOT)
    check_knn_root(cfg)
    if not cfg.DATASETS.CLASS_LIST or cfg.DATASETS.TYPE == FASHION_MNIST:
        return
    roots = [cfg.DATASETS.ROOT]
    if cfg.TEST.KNN_PERIOD > 0:  # the monitor reads the same classes of its train/ and val/
        roots += [os.path.join(cfg.TEST.KNN_ROOT, sub) for sub in ("train", "val")]
    check_class_folders(roots, cfg.DATASETS.CLASS_LIST, "DATASETS.CLASS_LIST")


def check_cpu_bfloat16(cfg: CfgNode) -> None:
    """Refuse bfloat16 autocast on the CPU where a strided 3x3 conv would see 1 px maps: there
    oneDNN's bfloat16 weight gradient of the padding-only taps is leftover memory (sometimes
    NaN) in about half the steps (``benchmarks/check_bf16_conv.py``); a finite garbage gradient
    would pass unseen.
    """
    amp = cfg.SOLVER.AMP
    if cfg.MODEL.DEVICE != "cpu" or not amp.ENABLED or amp.PRECISION != "bfloat16":
        return
    inp = cfg.INPUT
    sizes = {inp.LARGE_SIZE} if inp.LARGE_CROPS else set()
    sizes |= {inp.SMALL_SIZE} if inp.SMALL_CROPS else set()
    for size in sorted(sizes):
        convs = strided_convs_on_1px_maps(cfg.MODEL.ARCH, cfg.MODEL.STEM, size)
        if not convs:
            continue
        key = "INPUT.LARGE_SIZE" if size == inp.LARGE_SIZE else "INPUT.SMALL_SIZE"
        safe = next(
            s
            for s in range(size + 1, 4096)
            if not strided_convs_on_1px_maps(cfg.MODEL.ARCH, cfg.MODEL.STEM, s)
        )
        raise ConfigError(
            f"{key} = {size} with SOLVER.AMP bfloat16 on the CPU: {cfg.MODEL.ARCH}'s "
            f"{', '.join(convs)} (strided 3x3) sees 1x1 maps at {size} px, where oneDNN's "
            "bfloat16 weight gradient is wrong (benchmarks/check_bf16_conv.py). Use views of "
            f"at least {safe} px, MODEL.STEM small, or SOLVER.AMP.ENABLED False"
        )


def launch_world_size(args: argparse.Namespace) -> int:
    """The number of processes the run has: the process group's once joined (detectron2's
    ``launch`` workers), torchrun's or srun's variables, else ``--num-gpus x --num-machines``."""
    if comm.get_world_size() > 1:
        return comm.get_world_size()
    env = dist_env_from_environ()
    if env is not None:
        return env.world_size
    return getattr(args, "num_gpus", 1) * getattr(args, "num_machines", 1)


def check_run_dir(output_dir: str) -> None:
    """``OUTPUT_DIR`` is a directory this run can write (or create) and holds no other tool's
    run (:mod:`pretrain.utils.run_owner`); reads only."""
    check_output_dir(output_dir, "OUTPUT_DIR", owner=PRETRAINING)


def checked_config(args: argparse.Namespace, resume_with_changes: bool = False) -> CfgNode:
    """The validated config of ``args`` after every check that only reads (OUTPUT_DIR, a
    resume's config and checkpoint, the device, the data), so that a mistake leaves nothing a
    corrected command must clear."""
    # the config this run's number of processes uses (SOLVER.REFERENCE_WORLD_SIZE)
    cfg = resolve_world_size(load_args_config(args), launch_world_size(args))
    check_run_dir(cfg.OUTPUT_DIR)  # a file, read-only, another tool's: before anything runs
    check_resume_config(cfg, resume_with_changes)
    check_last_checkpoint(cfg.OUTPUT_DIR)  # a truncated one, before a resume writes anything
    check_device(cfg.MODEL.DEVICE)
    check_cpu_bfloat16(cfg)
    check_data(cfg)
    return cfg


def begin_run(cfg: CfgNode, args: argparse.Namespace) -> None:
    """The first writes of a run of ``cfg``, checked already (:func:`checked_config`): join the
    process group, hold OUTPUT_DIR (main process), set up logs and seeds."""
    # under torchrun or srun (one process per task): join the process group from their variables
    maybe_init_distributed(cfg.MODEL.DEVICE, timeout_min=cfg.DIST.TIMEOUT_MINUTES)
    if comm.is_main_process():
        # before the first log line: a second run into a live run's directory writes nothing
        DirLock(cfg.OUTPUT_DIR).acquire()
    # logging, seeds, cudnn; PretrainTrainer dumps config.yaml and env.txt
    setup_run(cfg, args, dump=False)


def setup(args: argparse.Namespace, resume_with_changes: bool = False) -> CfgNode:
    """:func:`checked_config`, then :func:`begin_run`: the config of a run ready to train."""
    cfg = checked_config(args, resume_with_changes)
    begin_run(cfg, args)
    return cfg
