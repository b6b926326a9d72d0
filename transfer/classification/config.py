"""Strict configs of the classification tools (fvcore ``CfgNode``; YAML files may use ``_BASE_``).

Defaults live here; ``configs/eval/*.yaml`` override them. An unknown key, a value of the wrong
type or an out-of-range value raises :class:`ConfigError` naming the file and the key. The loader
workers' ``-1`` (the default) is resolved on loading, so ``config.yaml`` records the count used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from detectron2.utils import comm
from fvcore.common.config import CfgNode as CN

from pretrain.config.defaults import MIN_IMAGES_PER_BN_BATCH
from pretrain.config.strict import check_override_pairs, load_strict
from pretrain.data.loader import AUTO_WORKERS, resolve_num_workers
from pretrain.utils.errors import ConfigError  # noqa: F401 (re-exported)

from .transfer_datasets import ALL_DATASET_NAMES, TRANSFER_DATASETS, paper_datasets

__all__ = [
    "TRANSFER_PROTOCOLS",
    "ConfigError",
    "linear_probe_defaults",
    "load_config",
    "semi_supervised_defaults",
    "svm_defaults",
    "transfer_defaults",
]


# TRANSFER.PROTOCOL values; see transfer.classification.transfer and docs/evaluation.md.
TRANSFER_PROTOCOLS = ("cached_features", "augmented", "finetune")
_DATA_NAMES = ("imagefolder", "fashion-mnist")


def _input(c: CN) -> None:
    c.INPUT = CN()
    c.INPUT.TRAIN_CROP = 224  # RandomResizedCrop size
    c.INPUT.TEST_RESIZE = 256  # shorter side before the centre crop
    c.INPUT.TEST_CROP = 224


def _data(c: CN) -> None:
    c.DATA = CN()
    c.DATA.NAME = "imagefolder"  # "imagefolder" (<root>/train, <root>/val) or "fashion-mnist"
    c.DATA.CLASS_LIST = ""  # optional file of class folder names (ImageNet-100)
    c.DATA.IMAGE_SIZE = 32  # Fashion-MNIST images are upsampled to this size
    c.DATA.NUM_WORKERS = AUTO_WORKERS  # -1: one per core of this process less one


def _common(c: CN) -> None:
    c.OUTPUT_DIR = ""
    c.SEED = 0
    c.DEVICE = ""  # "" picks cuda (the local rank's GPU) when available, else cpu
    c.LOG_PERIOD = 20


def linear_probe_defaults() -> CN:
    """Linear classification on frozen features, MoCo-v2 recipe (lr 30, x0.1 at 60 and 80)."""
    c = CN()
    _common(c)
    _data(c)
    _input(c)
    c.SOLVER = CN()
    c.SOLVER.BATCH_SIZE = 256  # total over all processes
    c.SOLVER.EPOCHS = 100
    c.SOLVER.MAX_ITER = 0  # > 0 replaces EPOCHS (quick schedules)
    c.SOLVER.BASE_LR = 30.0
    c.SOLVER.MOMENTUM = 0.9
    c.SOLVER.WEIGHT_DECAY = 0.0
    c.SOLVER.SCHEDULE = "step"  # "step" or "cosine"
    c.SOLVER.STEPS = (0.6, 0.8)  # fractions of training (epochs 60 and 80 of 100)
    c.SOLVER.GAMMA = 0.1
    c.SOLVER.CHECKPOINT_PERIOD = 5000  # iterations; the head and optimizer, for --resume
    c.TEST = CN()
    c.TEST.EVAL_PERIOD = 0  # iterations; 0 evaluates only at the end
    c.TEST.BATCH_SIZE = 256
    return c


def semi_supervised_defaults() -> CN:
    """Fine-tuning the whole network on 1% of ImageNet labels (SwAV recipe as in the paper)."""
    c = linear_probe_defaults()
    c.DATA.SPLIT_FILE = ""  # SimCLR subset file, e.g. 1percent.txt
    c.DATA.HELDOUT_PER_CLASS = 5  # unlabelled train images per class used to pick the lr
    c.DATA.LABEL_PERCENT = 1  # 1 or 10: the Table 3 column the result goes to
    c.SOLVER.pop("BASE_LR")  # the sweep below sets the learning rates
    c.SOLVER.pop("CHECKPOINT_PERIOD")  # re-added last: 0, one checkpoint at the end of each lr
    c.SOLVER.EPOCHS = 30
    c.SOLVER.LRS = ()  # explicit classifier lrs; empty -> NUM_LRS log-spaced in LR_RANGE
    c.SOLVER.LR_RANGE = (0.01, 10.0)
    c.SOLVER.NUM_LRS = 7
    c.SOLVER.HEAD_LR_MULT = 250.0  # classifier lr / backbone lr
    c.SOLVER.GAMMA = 0.2
    c.SOLVER.CHECKPOINT_PERIOD = 0  # and one at a Ctrl-C, for --resume
    return c


def transfer_defaults() -> CN:
    """The 12-dataset linear transfer protocol of Sec. 6.1 (cached features by default)."""
    c = CN()
    _common(c)
    c.INPUT = CN()
    c.INPUT.RESIZE = 256
    c.INPUT.CROP = 224
    c.FEATURES = CN()
    c.FEATURES.BATCH_SIZE = 256
    c.FEATURES.NUM_WORKERS = AUTO_WORKERS  # as DATA.NUM_WORKERS
    c.FEATURES.DTYPE = "float32"  # or "float16" to halve the cache (Places365: 1.8M x 2048)
    c.FEATURES.CACHE_DIR = ""  # "" -> <OUTPUT_DIR>/feature_cache
    c.TRANSFER = CN()
    # "cached_features": centre-crop features computed once and cached (FEATURES.*);
    # "augmented": the paper's RandomResizedCrop + flip through the frozen backbone every step.
    # "finetune": the whole network trained per dataset, lr and wd searched (FINETUNE.*).
    c.TRANSFER.PROTOCOL = "cached_features"
    c.TRANSFER.DATASETS = paper_datasets()  # the paper's 12; "voc2007" is the 13th on request
    c.TRANSFER.DATA_ROOT = ""  # each dataset at <DATA_ROOT>/<key> unless ROOTS.<KEY> is set
    c.TRANSFER.ROOTS = CN({k.upper(): "" for k in ALL_DATASET_NAMES})
    c.TRANSFER.LR_RANGE = (0.1, 100.0)
    c.TRANSFER.NUM_LRS = 7
    c.TRANSFER.BATCH_SIZE = 256
    c.TRANSFER.MOMENTUM = 0.9
    c.TRANSFER.WEIGHT_DECAY = 0.0
    c.TRANSFER.VAL_FRACTION = 0.2
    c.TRANSFER.BUDGET = CN(
        {key.upper(): CN({"ITERS": d.iters, "EPOCHS": d.epochs}) for key, d in TRANSFER_DATASETS}
    )
    _finetune(c)
    return c


def _finetune(c: CN) -> None:
    """``TRANSFER.PROTOCOL finetune``: SimCLR's Appendix B.8 fine-tuning (after Kornblith et al.
    2019), quoted in docs/evaluation.md; values in configs/eval/transfer_finetune.yaml."""
    c.FINETUNE = CN()
    c.FINETUNE.ITERS = 20000  # steps per search point and for the final train+val run
    c.FINETUNE.BATCH_SIZE = 256
    c.FINETUNE.MOMENTUM = 0.9  # SGD with Nesterov momentum
    c.FINETUNE.NESTEROV = True
    c.FINETUNE.LR_RANGE = (0.0001, 0.1)  # NUM_LRS log-spaced learning rates
    c.FINETUNE.NUM_LRS = 7
    c.FINETUNE.WD_RANGE = (1e-6, 1e-3)  # NUM_WDS log-spaced weight decays, plus 0 (ZERO_WD)
    c.FINETUNE.NUM_WDS = 7
    c.FINETUNE.ZERO_WD = True
    c.FINETUNE.WD_OVER_LR = True  # "we divide these values of weight decay by the learning rate"
    # BatchNorm statistics: TF decay max(1 - 10/s, 0.9), s = steps per epoch, i.e. PyTorch's
    # momentum min(10/s, 0.1); False keeps the backbone's own (0.1).
    c.FINETUNE.BN_MOMENTUM_PER_EPOCH = True
    c.FINETUNE.SCHEDULE = "cosine"  # "cosine" (to 0) or "constant"
    c.FINETUNE.CHECKPOINT_PERIOD = 2000  # iterations; the network and optimizer, for --resume


def svm_defaults() -> CN:
    """The VOC07 SVM benchmark (Goyal et al. 2019) as VISSL runs it (:mod:`.svm`)."""
    c = CN()
    _common(c)
    c.FEATURES = CN()
    c.FEATURES.BATCH_SIZE = 64
    c.FEATURES.NUM_WORKERS = AUTO_WORKERS
    c.FEATURES.CACHE_DIR = ""  # "" -> <OUTPUT_DIR>/feature_cache
    c.SVM = CN()
    c.SVM.IMAGE_SIZE = 224  # images resized to IMAGE_SIZE x IMAGE_SIZE (VISSL), no crop
    # "avgpool6" (OpenSelfSup's feat5, 8192-d: the published rows' pooling) or "gap" (res5 global
    # average pool, 2048-d; needs no 6 x 6 res5 map, so small test images use it)
    c.SVM.POOL = "avgpool6"
    c.SVM.NORMALIZE = True  # rows / (L2 norm + 1e-5)
    # Goyal et al.'s fair_self_supervision_benchmark train_svm_kfold.py cost list
    c.SVM.COSTS = (1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0)
    c.SVM.FOLDS = 3
    c.SVM.MAX_ITER = 2000
    c.SVM.POSITIVE_WEIGHT = 2.0  # class_weight {1: 2, -1: 1}
    # VISSL's eval_resnet_8gpu_transfer_voc07_low_shot_svm.yaml
    c.SVM.LOW_SHOT_COSTS = (0.01, 0.1, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 50.0, 100.0, 1000.0)
    c.SVM.LOW_SHOT_K = (1, 2, 4, 8, 16, 32, 64, 96)
    c.SVM.LOW_SHOT_DRAWS = 5  # seeds SEED, SEED + 1, ...
    return c


def load_config(
    defaults: CN, path: str = "", opts: Sequence[str] = (), tool_opts: Sequence[str] = ()
) -> CN:
    """``defaults`` merged with the YAML file ``path``, the user's ``KEY VALUE`` ``opts`` and then
    the tool's own ``tool_opts``, validated. The user's pairs are checked first, so that the
    message lists only what the user typed."""
    check_override_pairs(opts)
    cfg = load_strict(defaults, path, [*opts, *tool_opts])
    _validate(cfg, path or "<defaults>")
    _fit_workers(cfg, path or "<defaults>")
    cfg.freeze()
    return cfg


def _fit_workers(cfg: CN, src: str) -> None:
    """``DATA.NUM_WORKERS`` / ``FEATURES.NUM_WORKERS -1`` as the loader workers pretraining
    would start (:func:`~pretrain.data.loader.resolve_num_workers`): more than the cores slow
    loading down."""
    for group in ("DATA", "FEATURES"):
        if "NUM_WORKERS" in cfg.get(group, {}):
            name = f"{src}: {group}.NUM_WORKERS"
            given = cfg[group].NUM_WORKERS
            cfg[group].NUM_WORKERS = resolve_num_workers(given, comm.get_local_size(), name=name)


def _lr_range(r: Sequence[float]) -> bool:
    return len(r) == 2 and 0 < r[0] <= r[1]


def _check_fine_tuning_batch(cfg: CN, src: str) -> None:
    """Fine-tuning trains the backbone's BatchNorm: each process's batch needs
    ``MIN_IMAGES_PER_BN_BATCH`` images (pretraining's rule, ``check_batchnorm_batch``)."""
    world = comm.get_world_size()
    least = MIN_IMAGES_PER_BN_BATCH * world
    if least > cfg.SOLVER.BATCH_SIZE:
        per = f" x {world} processes" if world > 1 else ""
        raise ConfigError(
            f"{src}: SOLVER.BATCH_SIZE = {cfg.SOLVER.BATCH_SIZE}: must be at least {least} "
            f"({MIN_IMAGES_PER_BN_BATCH} images{per}): fine-tuning trains BatchNorm, which "
            "normalises over each process's batch and needs more than one image"
        )


def _validate(cfg: CN, src: str) -> None:
    def fail(key: str, value: object, what: str) -> None:
        raise ConfigError(f"{src}: {key} = {value!r}: {what}")

    def need(key: str, ok: Callable[[Any], bool], what: str) -> None:
        group, name = key.split(".")
        if not ok(cfg[group][name]):
            fail(key, cfg[group][name], what)

    for key in ("TRAIN_CROP", "TEST_RESIZE", "TEST_CROP", "RESIZE", "CROP"):
        if key in cfg.get("INPUT", {}):
            need(f"INPUT.{key}", lambda x: x > 0, "must be > 0")
    if "SOLVER" in cfg:
        need("SOLVER.BATCH_SIZE", lambda x: x > 0, "must be > 0")
        if not (cfg.SOLVER.EPOCHS > 0 or cfg.SOLVER.MAX_ITER > 0):
            fail("SOLVER.EPOCHS", cfg.SOLVER.EPOCHS, "or MAX_ITER must be > 0")
        need("SOLVER.SCHEDULE", lambda x: x in ("step", "cosine"), "step or cosine")
        need("SOLVER.STEPS", lambda x: all(0 < f < 1 for f in x), "fractions in (0, 1)")
        need("DATA.NAME", lambda x: x in _DATA_NAMES, "imagefolder or fashion-mnist")
        if "BASE_LR" in cfg.SOLVER:
            need("SOLVER.BASE_LR", lambda x: 0 < x < math.inf, "must be finite and > 0")
        need("SOLVER.MOMENTUM", lambda x: 0 <= x < 1, "in [0, 1)")
        need("SOLVER.WEIGHT_DECAY", lambda x: 0 <= x < math.inf, "must be finite and >= 0")
    if "LRS" in cfg.get("SOLVER", {}):
        need("SOLVER.LRS", lambda x: all(lr > 0 for lr in x), "must be > 0")
        need("SOLVER.LR_RANGE", _lr_range, "(low, high) with 0 < low <= high")
        need("SOLVER.HEAD_LR_MULT", lambda x: x > 0, "must be > 0")
        need("DATA.LABEL_PERCENT", lambda x: x in (1, 10), "1 or 10")
        need("DATA.HELDOUT_PER_CLASS", lambda x: x > 0, "must be > 0")
        _check_fine_tuning_batch(cfg, src)
    if "TRANSFER" in cfg:
        protocols = f"choose from {list(TRANSFER_PROTOCOLS)}"
        need("TRANSFER.PROTOCOL", lambda x: x in TRANSFER_PROTOCOLS, protocols)
        bad = [d for d in cfg.TRANSFER.DATASETS if d not in TRANSFER_DATASETS]
        if bad:
            fail("TRANSFER.DATASETS", bad, f"unknown; choose from {list(ALL_DATASET_NAMES)}")
        need("TRANSFER.VAL_FRACTION", lambda x: 0 < x < 1, "in (0, 1)")
        need("TRANSFER.LR_RANGE", _lr_range, "(low, high) with 0 < low <= high")
        need("TRANSFER.NUM_LRS", lambda x: x >= 1, "must be >= 1")
        for key, b in cfg.TRANSFER.BUDGET.items():
            if (b.ITERS > 0) == (b.EPOCHS > 0):
                one = "exactly one of ITERS and EPOCHS must be > 0"
                fail(f"TRANSFER.BUDGET.{key}", dict(b), one)
        need("FEATURES.DTYPE", lambda x: x in ("float32", "float16"), "float32 or float16")
    if "SVM" in cfg:
        need("SVM.IMAGE_SIZE", lambda x: x > 0, "must be > 0")
        need("SVM.POOL", lambda x: x in ("gap", "avgpool6"), "gap or avgpool6")
        if cfg.SVM.POOL == "avgpool6":  # res5 is IMAGE_SIZE / 32 on a side; the pool takes 6 x 6
            need("SVM.IMAGE_SIZE", lambda x: x >= 192, ">= 192 with SVM.POOL avgpool6 (or gap)")
        need("SVM.COSTS", lambda x: len(x) > 0 and all(v > 0 for v in x), "costs > 0")
        need("SVM.LOW_SHOT_COSTS", lambda x: len(x) > 0 and all(v > 0 for v in x), "costs > 0")
        need("SVM.FOLDS", lambda x: x >= 2, "must be >= 2")
        need("SVM.MAX_ITER", lambda x: x >= 1, "must be >= 1")
        need("SVM.POSITIVE_WEIGHT", lambda x: x > 0, "must be > 0")
        need("SVM.LOW_SHOT_K", lambda x: len(x) > 0 and all(k >= 1 for k in x), "k >= 1")
        need("SVM.LOW_SHOT_DRAWS", lambda x: x >= 1, "must be >= 1")
    if "FINETUNE" in cfg:
        need("FINETUNE.ITERS", lambda x: x >= 1, "must be >= 1")
        need("FINETUNE.BATCH_SIZE", lambda x: x >= 1, "must be >= 1")
        need("FINETUNE.MOMENTUM", lambda x: 0 <= x < 1, "in [0, 1)")
        need("FINETUNE.LR_RANGE", _lr_range, "(low, high) with 0 < low <= high")
        need("FINETUNE.WD_RANGE", _lr_range, "(low, high) with 0 < low <= high")
        need("FINETUNE.NUM_LRS", lambda x: x >= 1, "must be >= 1")
        need("FINETUNE.NUM_WDS", lambda x: x >= 0, "must be >= 0")
        if cfg.FINETUNE.NUM_WDS == 0 and not cfg.FINETUNE.ZERO_WD:
            fail("FINETUNE.NUM_WDS", 0, "with ZERO_WD False leaves no weight decay to try")
        need("FINETUNE.SCHEDULE", lambda x: x in ("cosine", "constant"), "cosine or constant")
        need("FINETUNE.CHECKPOINT_PERIOD", lambda x: x >= 0, "must be >= 0")
