"""Fine-tune and evaluate detectron2 R-CNNs from converted backbones (``tools/train_net.py``,
:mod:`transfer.cli.train_net`).

:class:`DetectionTrainer` is detectron2's ``DefaultTrainer`` with COCO evaluation (pycocotools,
no compiled ops), a strict check of ``MODEL.WEIGHTS`` against the built model, and DDP that also
works for multi-process CPU runs. :func:`setup` and :func:`run` are the body of the training
tool; :func:`build_argument_parser` is detectron2's parser plus dataset registration options.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import weakref
from collections.abc import Sequence

import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import CfgNode
from detectron2.engine import (
    AMPTrainer,
    DefaultTrainer,
    SimpleTrainer,
    TrainerBase,
    create_ddp_model,
    default_argument_parser,
)
from detectron2.evaluation import COCOEvaluator, DatasetEvaluator
from detectron2.utils import comm
from detectron2.utils.logger import setup_logger

from pretrain.utils.run_setup import setup_run

from .config import DetectionSetupError, load_config, use_naive_syncbn_on_cpu
from .datasets import check_datasets, parse_flip_pairs, register_coco_dataset
from .results import RESULTS_FILE, write_results
from .weights import check_weights_fit

__all__ = ["DetectionTrainer", "build_argument_parser", "register_datasets", "run", "setup"]

logger = logging.getLogger(__name__)


class DetectionTrainer(DefaultTrainer):
    """``DefaultTrainer`` with COCO evaluation and a strict check of the initial weights.

    Overridden, and why: ``build_evaluator`` (COCO AP through pycocotools: the fast COCOeval is
    a compiled op), ``test`` (also writes ``results.json``) and ``resume_or_load`` (a fresh start
    first checks that ``MODEL.WEIGHTS`` fits) are detectron2's public extension points.
    ``__init__`` is overridden for multi-process CPU runs only (tests, laptops):
    ``DefaultTrainer.__init__`` wraps the model with ``create_ddp_model(model,
    broadcast_buffers=False)``, which adds ``device_ids=[local_rank]``; torch rejects device_ids
    for CPU modules and detectron2 (0.7) offers no way to pass other DDP arguments. So those runs
    build the same objects in the same order through the public builders, with
    ``device_ids=None``, and set the loop where ``DefaultTrainer``'s ``run_step``,
    ``state_dict`` and ``model`` read it (``_trainer``): checkpoints are the same either way.
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
    def build_evaluator(cls, cfg: CfgNode, dataset_name: str) -> COCOEvaluator:
        tasks = ["bbox"]
        if cfg.MODEL.MASK_ON:
            tasks.append("segm")
        if cfg.MODEL.KEYPOINT_ON:
            tasks.append("keypoints")
        return COCOEvaluator(
            dataset_name,
            tasks=tuple(tasks),
            distributed=True,
            output_dir=f"{cfg.OUTPUT_DIR}/inference/{dataset_name}",
            max_dets_per_image=cfg.TEST.DETECTIONS_PER_IMAGE,
            use_fast_impl=False,  # the fast COCOeval is a compiled op; pycocotools is official
            kpt_oks_sigmas=cfg.TEST.KEYPOINT_OKS_SIGMAS,
        )

    @classmethod
    def test(
        cls,
        cfg: CfgNode,
        model: torch.nn.Module,
        evaluators: DatasetEvaluator | Sequence[DatasetEvaluator] | None = None,
    ) -> dict:
        """``DefaultTrainer.test``, also saving the results as ``OUTPUT_DIR/results.json`` (the
        evaluation at the end of training is the last one, so the file ends up final)."""
        results = super().test(cfg, model, evaluators)
        if comm.is_main_process() and results:
            path = write_results(cfg.OUTPUT_DIR, cfg, results, list(cfg.DATASETS.TEST))
            logger.info("Evaluation results written to %s", path)
        return results

    def resume_or_load(self, resume: bool = True) -> None:
        """As in ``DefaultTrainer``, but a fresh start first checks ``MODEL.WEIGHTS`` fits."""
        if not (resume and self.checkpointer.has_checkpoint()):
            if self.cfg.MODEL.WEIGHTS:
                check_weights_fit(self.model, self.cfg.MODEL.WEIGHTS)
            else:
                logger.info("MODEL.WEIGHTS is empty: training from random initialisation")
        super().resume_or_load(resume=resume)


def build_argument_parser() -> argparse.ArgumentParser:
    """detectron2's ``default_argument_parser`` plus ``--register-coco`` and flip pairs."""
    parser = default_argument_parser()
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


def register_datasets(args: argparse.Namespace) -> None:
    """Register the ``--register-coco`` datasets of ``args`` (in every process)."""
    pairs = parse_flip_pairs(args.keypoint_flip_pairs) if args.keypoint_flip_pairs else None
    for name, json_file, image_root in args.register_coco:
        register_coco_dataset(name, json_file, image_root, flip_pairs=pairs)


def load_checked_config(args: argparse.Namespace) -> tuple[CfgNode, list[str]]:
    """The frozen config of ``args`` with datasets registered and checked, and notes to log
    once logging is set up. Raises :class:`~pretrain.utils.errors.ConfigError` for the config and
    :class:`DetectionSetupError` for datasets and the device."""
    register_datasets(args)
    cfg = load_config(args.config_file, args.opts or [])
    notes = []
    if changed := use_naive_syncbn_on_cpu(cfg, comm.get_world_size()):
        notes.append(
            f"CPU with {comm.get_world_size()} processes: torch's SyncBatchNorm needs GPUs, so "
            f"naiveSyncBN for {', '.join(changed)}"
        )
    if cfg.MODEL.DEVICE.startswith("cuda") and not torch.cuda.is_available():
        raise DetectionSetupError(
            f"MODEL.DEVICE is {cfg.MODEL.DEVICE!r} but torch sees no GPU; add MODEL.DEVICE cpu"
        )
    check_datasets(cfg)
    cfg.freeze()
    return cfg, notes


def setup(args: argparse.Namespace) -> CfgNode:
    """Checked config, plus the project's run setup (logs, config and environment dump, seeds)."""
    cfg, notes = load_checked_config(args)
    setup_run(cfg, args)
    for note in notes:
        logger.info(note)
    return cfg


def run(args: argparse.Namespace) -> dict:
    """Train (or with ``--eval-only`` evaluate) as ``args`` say.

    Returns the final COCO results ``{dataset: {task: {metric: value}}}`` as saved in
    ``OUTPUT_DIR/results.json`` on the main process (``{}`` on the others)."""
    cfg = setup(args)
    results_path = os.path.join(cfg.OUTPUT_DIR, RESULTS_FILE)
    if comm.is_main_process() and os.path.exists(results_path):
        os.remove(results_path)  # never report a previous run's numbers
    if args.eval_only:
        model = DetectionTrainer.build_model(cfg)
        checkpointer = DetectionCheckpointer(model, save_dir=cfg.OUTPUT_DIR)
        if args.resume and checkpointer.has_checkpoint():
            path = checkpointer.get_checkpoint_file()
        else:
            path = cfg.MODEL.WEIGHTS
        if not path:
            raise DetectionSetupError("--eval-only needs MODEL.WEIGHTS (a trained model)")
        check_weights_fit(model, path, required_prefix="")
        checkpointer.load(path, checkpointables=[])
        DetectionTrainer.test(cfg, model)
    else:
        trainer = DetectionTrainer(cfg)
        trainer.resume_or_load(resume=args.resume)
        trainer.train()
    if not comm.is_main_process():
        return {}
    with open(results_path) as f:
        return json.load(f)["results"]
