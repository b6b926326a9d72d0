"""Fine-tune and evaluate detectron2 models from converted backbones, for every protocol of
:mod:`.evaluation`: the body of ``tools/train_net.py`` (:func:`build_argument_parser`,
:func:`setup`, :func:`run`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import weakref
from collections.abc import Iterable

import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import CfgNode
from detectron2.data import MetadataCatalog
from detectron2.engine import (
    AMPTrainer,
    DefaultTrainer,
    HookBase,
    SimpleTrainer,
    TrainerBase,
    create_ddp_model,
)
from detectron2.evaluation import DatasetEvaluator
from detectron2.projects.deeplab import build_lr_scheduler as build_deeplab_lr_scheduler
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger
from torch import nn

from pretrain.cli.launching import launch_parser
from pretrain.engine.hooks import StopOnSignal
from pretrain.engine.writers import build_writers
from pretrain.utils.run_setup import setup_run
from pretrain.utils.signals import STOP
from transfer.run_dir import RunAction, RunDir, add_run_dir_args

from .config import (
    DetectionSetupError,
    fit_precise_bn_to_cpu,
    fit_workers_to_cores,
    ignore_amp_on_cpu,
    is_semantic,
    load_config,
    use_naive_syncbn_on_cpu,
)
from .datasets import check_datasets, parse_flip_pairs, register_coco_dataset
from .evaluation import build_evaluator
from .results import RESULTS_FILE, read_results, write_results
from .semantic import build_sem_seg_train_loader
from .weights import LayoutCheckpointer, check_weights_fit

__all__ = [
    "DetectionTrainer",
    "build_argument_parser",
    "detection_run_dir",
    "run",
    "setup",
]

logger = logging.getLogger(__name__)

# DefaultTrainer's PeriodicWriter period: the ranks agree on a stop as often
_WRITER_PERIOD = 20

# What a resumed detection run may change besides pretraining's list: how it is watched.
RESUME_MAY_CHANGE = ("TEST.EVAL_PERIOD", "VIS_PERIOD")


class DetectionTrainer(DefaultTrainer):
    """``DefaultTrainer`` with the evaluator of each test set's protocol
    (:func:`~.evaluation.build_evaluator`), a strict check of the weights it starts from, loaded
    into the model's layout (:class:`~.weights.LayoutCheckpointer`), and Ctrl-C saving a
    checkpoint (exit 130).

    ``__init__`` is overridden for multi-process CPU runs only: ``DefaultTrainer`` passes
    ``device_ids=[local_rank]`` to DDP, which torch rejects for CPU modules, and detectron2 (0.7)
    offers no other way. Those runs build the same objects in the same order through the public
    builders with ``device_ids=None`` and set ``_trainer``, where ``DefaultTrainer`` reads the
    loop: checkpoints are the same either way.
    """

    def __init__(self, cfg: CfgNode) -> None:
        if cfg.MODEL.DEVICE != "cpu" or comm.get_world_size() == 1:
            super().__init__(cfg)
            return
        TrainerBase.__init__(self)
        if not logging.getLogger("detectron2").isEnabledFor(logging.INFO):
            setup_logger()
        cfg = DefaultTrainer.auto_scale_workers(cfg, comm.get_world_size())
        model = self.build_model(cfg)
        optimizer = self.build_optimizer(cfg, model)
        data_loader = self.build_train_loader(cfg)
        model = create_ddp_model(model, broadcast_buffers=False, device_ids=None)
        loop = AMPTrainer if cfg.SOLVER.AMP.ENABLED else SimpleTrainer
        self._trainer = loop(model, data_loader, optimizer)
        self.scheduler = self.build_lr_scheduler(cfg, optimizer)
        self.checkpointer = DetectionCheckpointer(
            model, cfg.OUTPUT_DIR, trainer=weakref.proxy(self)
        )
        self.start_iter = 0
        self.max_iter = cfg.SOLVER.MAX_ITER
        self.cfg = cfg
        self.register_hooks(self.build_hooks())

    @classmethod
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str) -> DatasetEvaluator:
        return build_evaluator(cfg, dataset_name)

    @classmethod
    def build_train_loader(cls, cfg: CfgNode) -> Iterable[list[dict]]:
        """detectron2's loader; semantic segmentation crops and pads as DeepLab does
        (:func:`~transfer.detection.semantic.build_sem_seg_train_augmentations`)."""
        if is_semantic(cfg):
            return build_sem_seg_train_loader(cfg)
        return super().build_train_loader(cfg)

    @classmethod
    def build_lr_scheduler(
        cls, cfg: CfgNode, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LRScheduler:
        """detectron2's schedulers, and DeepLab's ``WarmupPolyLR`` for
        ``SOLVER.LR_SCHEDULER_NAME WarmupPolyLR`` (DeepLab's builder hands every other name to
        detectron2's)."""
        return build_deeplab_lr_scheduler(cfg, optimizer)

    def build_hooks(self) -> list[HookBase]:
        """``DefaultTrainer``'s hooks, then :class:`~pretrain.engine.hooks.StopOnSignal` for
        Ctrl-C only (SLURM requeues the tool with ``--resume``); last, so that its
        ``after_train`` restores the handlers after the final evaluation."""
        stop = StopOnSignal(
            {signal.SIGINT: STOP},
            agree_every=_WRITER_PERIOD,
            each_step=True,
            resume="when the same command is run again with --resume",
        )
        return [*super().build_hooks(), stop]

    def build_writers(self) -> list:
        """The writers of every training tool (:func:`pretrain.engine.writers.build_writers`)."""
        return build_writers(self.cfg.OUTPUT_DIR, self.max_iter)

    @property
    def last_results(self) -> dict:
        """The results of ``EvalHook``'s last evaluation; ``{}`` when none ran."""
        return dict(getattr(self, "_last_eval_results", None) or {})

    def resume_or_load(self, resume: bool = True) -> None:
        """As in ``DefaultTrainer``, but first checks that the file it loads fits the model:
        ``MODEL.WEIGHTS`` on a fresh start (renamed to the model's layout), the last checkpoint
        (every tensor) on a resume."""
        check_start_weights(self.cfg, self.model, resume)
        if resume and self.checkpointer.has_checkpoint():
            super().resume_or_load(resume=True)
        else:
            LayoutCheckpointer(self.model).load(self.cfg.MODEL.WEIGHTS, checkpointables=[])


def check_start_weights(cfg: CfgNode, model: torch.nn.Module, resume: bool) -> None:
    """Raise :class:`DetectionSetupError` unless what a run starts from fits ``model``: on a
    resume the whole last checkpoint (never fvcore's skipped-parameter warning), else
    ``MODEL.WEIGHTS``' backbone."""
    checkpoint = last_checkpoint(cfg.OUTPUT_DIR) if resume else ""
    if checkpoint:
        check_weights_fit(model, checkpoint, required_prefix="", what="checkpoint")
    elif cfg.MODEL.WEIGHTS:
        check_weights_fit(model, cfg.MODEL.WEIGHTS)
    else:
        logger.info("MODEL.WEIGHTS is empty: training from random initialisation")


def last_checkpoint(output_dir: str) -> str:
    """The checkpoint ``output_dir/last_checkpoint`` names, or ``""`` when there is none."""
    return DetectionCheckpointer(nn.Module(), save_dir=output_dir).get_checkpoint_file()


def build_argument_parser() -> argparse.ArgumentParser:
    """detectron2's ``default_argument_parser`` plus ``--overwrite``, ``--register-coco`` and
    flip pairs; its errors are one line."""
    parser = launch_parser()
    add_run_dir_args(parser)
    parser.add_argument(
        "--register-coco",
        nargs=3,
        action="append",
        default=[],
        metavar=("NAME", "JSON", "IMAGE_ROOT"),
        help="register a COCO-format dataset under NAME (repeatable); use NAME in "
        "DATASETS.TRAIN/TEST",
    )
    parser.add_argument(
        "--keypoint-flip-pairs",
        default=None,
        metavar="L:R,...",
        help="horizontal-flip keypoint pairs of registered datasets, e.g. 'l_eye:r_eye,l_ear:"
        "r_ear' (default: pairs named left_X/right_X, as in COCO)",
    )
    return parser


def load_checked_config(args: argparse.Namespace) -> tuple[CfgNode, list[str]]:
    """The frozen config of ``args`` with datasets registered and checked, and notes to log
    once logging is set up."""
    pairs = parse_flip_pairs(args.keypoint_flip_pairs) if args.keypoint_flip_pairs else None
    for name, json_file, image_root in args.register_coco:  # in every process
        register_coco_dataset(name, json_file, image_root, flip_pairs=pairs)
    cfg = load_config(args.config_file, args.opts or [])
    notes = []
    if changed := use_naive_syncbn_on_cpu(cfg, comm.get_world_size()):
        notes.append(
            f"CPU with {comm.get_world_size()} processes: torch's SyncBatchNorm needs GPUs, so "
            f"naiveSyncBN for {', '.join(changed)}"
        )
    fitted = (
        fit_workers_to_cores(cfg, args.num_gpus),
        fit_precise_bn_to_cpu(cfg),
        ignore_amp_on_cpu(cfg),
    )
    notes += [note for note in fitted if note]
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise DetectionSetupError(
            f"MODEL.DEVICE is {cfg.MODEL.DEVICE!r} but torch sees no GPU; add MODEL.DEVICE cpu"
        )
    check_datasets(cfg, test_only=args.eval_only)  # --eval-only reads the test sets alone
    cfg.freeze()
    return cfg, notes


def detection_run_dir(cfg: CfgNode) -> RunDir:
    """``OUTPUT_DIR`` as a :class:`~transfer.run_dir.RunDir`: finished when ``results.json`` is
    there; ``--overwrite`` also deletes the COCO evaluator's ``inference/``."""
    return RunDir(
        cfg.OUTPUT_DIR, "OUTPUT_DIR", own=("inference",), may_change=RESUME_MAY_CHANGE,
        resumable=True, tool="train_net",
    )  # fmt: skip


def _check_before_writing(args: argparse.Namespace, cfg: CfgNode) -> RunAction:
    """The checks that only read: the run directory and the weights the run starts from,
    against a model built on the CPU."""
    action = detection_run_dir(cfg).check(args.resume, args.overwrite, cfg)
    if action is RunAction.DONE and not args.eval_only:
        return action
    cpu_cfg = cfg.clone()
    cpu_cfg.defrost()
    cpu_cfg.MODEL.DEVICE = "cpu"
    model = DetectionTrainer.build_model(cpu_cfg)
    resume = args.resume and action is not RunAction.OVERWRITE
    if args.eval_only:
        path = (last_checkpoint(cfg.OUTPUT_DIR) if resume else "") or cfg.MODEL.WEIGHTS
        if not path:
            raise DetectionSetupError("--eval-only needs MODEL.WEIGHTS (a trained model)")
        check_weights_fit(model, path, required_prefix="")
    else:
        check_start_weights(cfg, model, resume)
    return action


def setup(args: argparse.Namespace) -> tuple[CfgNode, RunAction]:
    """Checked config and run directory (nothing written yet), then the directory's lock and the
    run setup; a finished run resumed is left untouched."""
    cfg, notes = load_checked_config(args)
    action = _check_before_writing(args, cfg)
    if action is RunAction.DONE and not args.eval_only:
        return cfg, action
    if comm.is_main_process():
        detection_run_dir(cfg).start(action)
    comm.synchronize()  # the other ranks write their logs only after the main one cleared
    setup_run(cfg, args)
    for note in notes:
        logger.info(note)
    return cfg, action


def _evaluate(args: argparse.Namespace, cfg: CfgNode) -> dict:
    model = DetectionTrainer.build_model(cfg)
    checkpointer = LayoutCheckpointer(model, save_dir=cfg.OUTPUT_DIR)
    path = (last_checkpoint(cfg.OUTPUT_DIR) if args.resume else "") or cfg.MODEL.WEIGHTS
    checkpointer.load(path, checkpointables=[])
    return DetectionTrainer.test(cfg, model)


def run(args: argparse.Namespace) -> dict:
    """Train (or with ``--eval-only`` evaluate) as ``args`` say; returns ``results.json``'s
    ``{dataset: {task: {metric: value}}}`` on the main process (``{}`` elsewhere or untested)."""
    cfg, action = setup(args)
    if action is RunAction.DONE and not args.eval_only:
        print(f"{cfg.OUTPUT_DIR} holds a finished run ({RESULTS_FILE}): nothing left to do")
        return read_results(cfg.OUTPUT_DIR) if comm.is_main_process() else {}
    if args.eval_only:
        results = _evaluate(args, cfg)
    else:
        trainer = DetectionTrainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        trainer.train()
        results = trainer.last_results
    if not comm.is_main_process():
        return {}
    tests = list(cfg.DATASETS.TEST)
    kind = MetadataCatalog.get(tests[0]).get("evaluator_type", "") if tests else ""
    path = write_results(cfg.OUTPUT_DIR, cfg, results, tests, evaluator_type=kind)
    if not cfg.DATASETS.TEST:
        print(f"DATASETS.TEST is empty: no evaluation ran; the model is in {cfg.OUTPUT_DIR}")
        return {}
    logger.info("Evaluation results written to %s", path)
    return read_results(cfg.OUTPUT_DIR)
