"""Pretraining configuration: defaults, strict YAML merging and validation.

Configs are fvcore ``CfgNode`` YAML files that inherit through ``_BASE_``; unknown keys are
errors (:func:`pretrain.config.strict.load_strict`). Every key is documented here in one line;
``docs/pretraining.md`` and ``docs/method.md`` explain the choices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fvcore.common.config import CfgNode as CN

from pretrain.config.strict import load_strict
from pretrain.utils.errors import ConfigError  # noqa: F401 (re-exported)

__all__ = [
    "AMP_PRECISIONS",
    "ARCHS",
    "COMPILE_BACKENDS",
    "COMPILE_MODES",
    "DATASET_TYPES",
    "DEVICES",
    "FASHION_MNIST",
    "IMAGEFILES",
    "IMAGEFOLDER",
    "LABELLED_DATASET_TYPES",
    "NORMS",
    "OPTIMIZERS",
    "STEMS",
    "ConfigError",
    "check_batchnorm_batch",
    "check_world_size",
    "get_cfg",
    "load_config",
    "validate_cfg",
]


# The values a key may take, read by validate_cfg and by the code acting on them.
ARCHS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")  # MODEL.ARCH
STEMS = ("imagenet", "small")  # MODEL.STEM
NORMS = ("auto", "SyncBN", "NaiveSyncBN", "BN")  # MODEL.NORM
DEVICES = ("cpu", "cuda")  # MODEL.DEVICE
OPTIMIZERS = ("LARS", "SGD")  # SOLVER.OPTIMIZER
# SOLVER.COMPILE.MODE: torch.compile's modes
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_BACKENDS = ("inductor", "aot_eager")  # SOLVER.COMPILE.BACKEND (MODE is inductor's)
AMP_PRECISIONS = ("bfloat16", "float16")  # SOLVER.AMP.PRECISION
IMAGEFOLDER, FASHION_MNIST, IMAGEFILES = "imagefolder", "fashion_mnist", "imagefiles"
LABELLED_DATASET_TYPES = (IMAGEFOLDER, FASHION_MNIST)  # datasets with labels (the evaluations')
DATASET_TYPES = (*LABELLED_DATASET_TYPES, IMAGEFILES)  # DATASETS.TYPE

_C = CN()
_C.VERSION = 1

_C.MODEL = CN()
# In META_ARCH_REGISTRY; "MultiViewMoCo" is LORAC, MoCo-M (prior none) and MoCo-v2 (one key crop)
_C.MODEL.META_ARCHITECTURE = "MultiViewMoCo"
# "cpu" or "cuda" (which stops where no GPU is visible)
_C.MODEL.DEVICE = "cuda"
_C.MODEL.ARCH = "resnet50"  # a torchvision ResNet of ARCHS: resnet18/34/50/101/152
# "imagenet" (7x7/2 conv + max-pool) or "small" (3x3/1 conv, for 28-32 px; no detectron2 export)
_C.MODEL.STEM = "imagenet"
# Query encoder's norm when distributed: "SyncBN" (pretrain.modeling.norm), "NaiveSyncBN", "BN";
# "auto" = SyncBN. Single-process runs use plain BN.
_C.MODEL.NORM = "auto"
_C.MODEL.HEAD_HIDDEN_DIM = 2048
_C.MODEL.HEAD_OUT_DIM = 128
_C.MODEL.MOMENTUM = 0.999  # key-encoder EMA
_C.MODEL.QUEUE_SIZE = 65536  # K, per key crop; must be divisible by the global batch
_C.MODEL.SHUFFLE_BN = True  # shuffle the key batch across processes (no-op on one process)
# BN groups per process for the key encoder (1 = MoCo; N processes x 1 == 1 process x N)
_C.MODEL.KEY_BN_SPLITS = 1
_C.MODEL.CHANNELS_LAST = False

_C.LOSS = CN()
_C.LOSS.TAU = 0.2
_C.LOSS.PRIOR = "laplace"  # laplace | gaussian | constant | none | batchwise
_C.LOSS.BETA = 4.0  # the prior's beta once it is switched on; "inf" disables the prior
# beta = inf (no prior) for the first BETA_INF_EPOCHS epochs (paper: 100 of 200 on IN-1K).
_C.LOSS.BETA_INF_EPOCHS = 0.0
_C.LOSS.C = 3.0  # prior "constant" (L-sftmx-c)
_C.LOSS.C0 = math.sqrt(5.0)  # prior "gaussian": centre
_C.LOSS.SIGMA2 = 2.0  # prior "gaussian": variance
# Views whose queries enter Q besides the keys: "large" (the paper's, Sec. 6.1), "all", "queries"
_C.LOSS.LOWRANK_VIEWS = "large"
# "instance" (one Q of all keys per instance) or "per_key_crop" (docs/method.md)
_C.LOSS.Q_CONSTRUCTION = "instance"
_C.LOSS.PRIOR_M = 0  # the M normalising the prior; 0 = number of rows of Q (see docs/method.md)
# Nuclear norm eigensolver: "auto" (Jacobi in a GPU static step, else eigh), "eigh", "jacobi"
_C.LOSS.NUCLEAR_NORM = "auto"

_C.INPUT = CN()
# Views: LARGE_CROPS crops of LARGE_SIZE then SMALL_CROPS of SMALL_SIZE (paper: 3x224 + 5x96)
_C.INPUT.LARGE_SIZE = 224
_C.INPUT.LARGE_CROPS = 3
_C.INPUT.LARGE_SCALE = (0.14, 1.0)
_C.INPUT.SMALL_SIZE = 96
_C.INPUT.SMALL_CROPS = 5
_C.INPUT.SMALL_SCALE = (0.05, 0.14)
_C.INPUT.KEY_CROPS = 2  # the first KEY_CROPS large crops are key crops (one queue each)
# The colour ops' settings (pretrain.data.color: Jitter, Grayscale, Blur)
_C.INPUT.COLOR_JITTER = (0.8, 0.8, 0.8, 0.2)
_C.INPUT.JITTER_PROB = 0.8
_C.INPUT.GRAYSCALE_PROB = 0.2
_C.INPUT.BLUR_SIGMA = (0.1, 2.0)
_C.INPUT.BLUR_PROB = 0.5
# Colour ops batched on the model's device instead of per image in the workers (same draws)
_C.INPUT.COLOR_ON_DEVICE = True

_C.DATASETS = CN()
# "imagefolder" (<ROOT>/<class>/<image>), "fashion_mnist" or "imagefiles" (any image, no labels)
_C.DATASETS.TYPE = "imagefolder"
_C.DATASETS.ROOT = ""  # ImageFolder root (e.g. .../imagenet/train), the Fashion-MNIST folder, ...
# Class list file restricting an imagefolder root; "imagenet100": the shipped CMC list
_C.DATASETS.CLASS_LIST = ""
_C.DATASETS.MAX_IMAGES = 0  # use only the first N images (0 = all); for smoke runs

_C.DATALOADER = CN()
# Data workers per training process; -1: this process's share of the cores, less one
_C.DATALOADER.NUM_WORKERS = -1

_C.SOLVER = CN()
_C.SOLVER.OPTIMIZER = "LARS"  # "LARS" (LORAC, MoCo-M) or "SGD" (MoCo-v2)
_C.SOLVER.IMS_PER_BATCH = 256  # global batch, all processes together
# Processes IMS_PER_BATCH and the lrs were written for; on another number the batch and lrs scale
# with it, per-process batch kept (detectron2's rule; pretrain.config.world_size). 0: as written
_C.SOLVER.REFERENCE_WORLD_SIZE = 0
_C.SOLVER.EPOCHS = 200.0
_C.SOLVER.MAX_ITER = 0  # 0: derived from EPOCHS and the dataset size
_C.SOLVER.BASE_LR = 1.8
_C.SOLVER.FINAL_LR = 0.018  # cosine (per iteration) from BASE_LR to FINAL_LR
_C.SOLVER.WARMUP_EPOCHS = 0.0  # linear warm-up from 0
_C.SOLVER.MOMENTUM = 0.9
_C.SOLVER.WEIGHT_DECAY = 1e-6
_C.SOLVER.LARS_ETA = 0.001  # trust coefficient
_C.SOLVER.CHECKPOINT_PERIOD = 5000  # iterations
# periodic checkpoints kept besides model_final, over the run and its resumes (0: all)
_C.SOLVER.MAX_TO_KEEP = 2
_C.SOLVER.LOG_PERIOD = 20
_C.SOLVER.AMP = CN()
_C.SOLVER.AMP.ENABLED = False
_C.SOLVER.AMP.PRECISION = "bfloat16"  # "bfloat16" or "float16" (float16 uses a GradScaler)
# Same device ops and shapes every step, as a graph replay needs (docs/performance.md)
_C.SOLVER.STATIC_STEP = False
# torch.compile of the step's device work, implies STATIC_STEP; MODE is torch.compile's
_C.SOLVER.COMPILE = CN()
_C.SOLVER.COMPILE.ENABLED = False
_C.SOLVER.COMPILE.MODE = "default"
# "inductor", or "aot_eager" (the traced graphs on eager kernels: the CPU tests)
_C.SOLVER.COMPILE.BACKEND = "inductor"

_C.TEST = CN()
_C.TEST.KNN_PERIOD = 0  # iterations between kNN evaluations (0 = off)
# the weighted kNN's k and T everywhere (pretrain.evaluation.knn reads its defaults here)
_C.TEST.KNN_K = 200
_C.TEST.KNN_T = 0.07
_C.TEST.KNN_TRAIN_IMAGES = 10000  # subset sizes for the periodic kNN
_C.TEST.KNN_TEST_IMAGES = 2000
# kNN monitor's root with train/ and val/ class folders ("" = DATASETS.ROOT for fashion_mnist)
_C.TEST.KNN_ROOT = ""
_C.TEST.KNN_BATCH_SIZE = 256

_C.DIST = CN()
# Whole minutes a collective waits for the other processes: a hung rank ends the job soon
_C.DIST.TIMEOUT_MINUTES = 10

_C.OUTPUT_DIR = "./output"
_C.SEED = 0  # all data order and augmentation randomness derive from it (exact resume)
_C.CUDNN_BENCHMARK = False


def get_cfg() -> CN:
    """A copy of the default pretraining config."""
    return _C.clone()


def load_config(path: str, opts: Sequence[str] | None = None) -> CN:
    """Defaults, merged with ``path`` (``_BASE_`` aware) and ``opts``; validated and frozen."""
    cfg = load_strict(get_cfg(), path, opts or ())
    validate_cfg(cfg)
    cfg.freeze()
    return cfg


def _need(ok: bool, key: str, value: object, why: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r}: {why}")


def _one_of(node: CN, key: str, prefix: str, choices: Sequence[str]) -> None:
    _need(node[key] in choices, f"{prefix}.{key}", node[key], f"must be one of {tuple(choices)}")


def validate_cfg(cfg: CN, world_size: int = 1) -> None:
    """Raise :class:`ConfigError` naming the first invalid key. Cheap; runs before training."""
    _check_positive(cfg)
    _check_loss(cfg.LOSS)
    _check_input(cfg.INPUT)
    _check_model(cfg.MODEL)
    _check_solver(cfg.SOLVER, cfg.MODEL.QUEUE_SIZE, world_size)
    check_world_size(cfg, world_size)
    _check_datasets(cfg.DATASETS)
    _need(cfg.DIST.TIMEOUT_MINUTES > 0, "DIST.TIMEOUT_MINUTES", cfg.DIST.TIMEOUT_MINUTES,
          "must be > 0 (minutes)")  # fmt: skip
    workers = cfg.DATALOADER.NUM_WORKERS
    _need(workers >= -1, "DATALOADER.NUM_WORKERS", workers, "a number >= 0, or -1 for one per core")
    _check_test(cfg.TEST, cfg.DATASETS.TYPE)


def _check_loss(loss: CN) -> None:
    from pretrain.losses.lorac import LOWRANK_VIEW_SETS, Q_CONSTRUCTIONS
    from pretrain.losses.nuclear import NUCLEAR_NORM_METHODS
    from pretrain.losses.priors import prior_names

    _need(math.isfinite(loss.TAU) and loss.TAU > 0, "LOSS.TAU", loss.TAU, "must be > 0")
    _need(float(loss.BETA) > 0, "LOSS.BETA", loss.BETA, "must be > 0 (inf disables the prior)")
    # asked of the registry now, so that a prior registered by a user's module is accepted too
    _one_of(loss, "PRIOR", "LOSS", prior_names())
    _need(loss.SIGMA2 > 0, "LOSS.SIGMA2", loss.SIGMA2, "must be > 0")
    for key in ("C", "C0"):  # the constant and gaussian priors' (pretrain.losses.priors)
        _need(math.isfinite(loss[key]), f"LOSS.{key}", loss[key], "must be a finite number")
    _one_of(loss, "LOWRANK_VIEWS", "LOSS", LOWRANK_VIEW_SETS)
    _one_of(loss, "Q_CONSTRUCTION", "LOSS", Q_CONSTRUCTIONS)
    _need(loss.PRIOR_M >= 0, "LOSS.PRIOR_M", loss.PRIOR_M, "must be >= 0")
    _one_of(loss, "NUCLEAR_NORM", "LOSS", NUCLEAR_NORM_METHODS)
    _need(loss.BETA_INF_EPOCHS >= 0, "LOSS.BETA_INF_EPOCHS", loss.BETA_INF_EPOCHS, "must be >= 0")


def _check_input(inp: CN) -> None:
    views = inp.LARGE_CROPS + inp.SMALL_CROPS
    _need(inp.LARGE_CROPS >= 1, "INPUT.LARGE_CROPS", inp.LARGE_CROPS, "need at least one")
    _need(inp.SMALL_CROPS >= 0, "INPUT.SMALL_CROPS", inp.SMALL_CROPS, "must be >= 0")
    _need(views >= 2, "INPUT.LARGE_CROPS + INPUT.SMALL_CROPS", views, "need at least two views")
    _need(1 <= inp.KEY_CROPS <= inp.LARGE_CROPS, "INPUT.KEY_CROPS", inp.KEY_CROPS,
          "must be between 1 and INPUT.LARGE_CROPS")  # fmt: skip
    # By name, so that a new colour op's keys are checked too (pretrain.data.color.ColorOp).
    for key in (k for k in inp if k.endswith("_PROB")):
        _need(0 <= inp[key] <= 1, f"INPUT.{key}", inp[key], "must be a probability in [0, 1]")
    for key in (k for k in inp if k.endswith(("_SCALE", "_SIGMA"))):
        lo, hi = inp[key]
        _need(0 < lo <= hi, f"INPUT.{key}", inp[key], "must be (low, high) with 0 < low <= high")


# Sizes and counts that must be >= 1: a 0 head dim trains a constant head without an error, a 0
# image size fails deep in the data pipeline. Checked by validate_cfg before anything is written.
POSITIVE_INTS = (
    "MODEL.HEAD_HIDDEN_DIM",
    "MODEL.HEAD_OUT_DIM",
    "MODEL.QUEUE_SIZE",
    "INPUT.LARGE_SIZE",
    "INPUT.SMALL_SIZE",
    "SOLVER.IMS_PER_BATCH",
)


def _check_positive(cfg: CN) -> None:
    for key in POSITIVE_INTS:
        section, name = key.split(".")
        value = cfg[section][name]
        _need(value >= 1, key, value, "must be >= 1")


def _check_model(mod: CN) -> None:
    _one_of(mod, "ARCH", "MODEL", ARCHS)
    _one_of(mod, "STEM", "MODEL", STEMS)
    _need(0 <= mod.MOMENTUM < 1, "MODEL.MOMENTUM", mod.MOMENTUM, "must be in [0, 1)")
    _one_of(mod, "NORM", "MODEL", NORMS)
    _one_of(mod, "DEVICE", "MODEL", DEVICES)


def _check_solver(sol: CN, queue_size: int, world_size: int) -> None:
    batch = sol.IMS_PER_BATCH  # >= 1: _check_positive
    _check_batch_split(batch, world_size)
    _need(queue_size % batch == 0, "MODEL.QUEUE_SIZE", queue_size,
          f"must be divisible by the global key batch SOLVER.IMS_PER_BATCH = {batch}")  # fmt: skip
    _one_of(sol, "OPTIMIZER", "SOLVER", OPTIMIZERS)
    _need(sol.REFERENCE_WORLD_SIZE >= 0, "SOLVER.REFERENCE_WORLD_SIZE", sol.REFERENCE_WORLD_SIZE,
          "must be >= 0 (0: the config as written at any number of processes)")  # fmt: skip
    _need(math.isfinite(sol.BASE_LR) and sol.BASE_LR > 0, "SOLVER.BASE_LR", sol.BASE_LR,
          "must be > 0")  # fmt: skip
    _need(math.isfinite(sol.FINAL_LR) and sol.FINAL_LR >= 0, "SOLVER.FINAL_LR", sol.FINAL_LR,
          "must be >= 0")  # fmt: skip
    _need(sol.MAX_ITER >= 0, "SOLVER.MAX_ITER", sol.MAX_ITER, "must be >= 0 (0: from EPOCHS)")
    _need(sol.EPOCHS > 0 or (sol.MAX_ITER > 0 and sol.EPOCHS >= 0), "SOLVER.EPOCHS", sol.EPOCHS,
          "must be > 0 unless SOLVER.MAX_ITER is set")  # fmt: skip
    _need(sol.WARMUP_EPOCHS >= 0, "SOLVER.WARMUP_EPOCHS", sol.WARMUP_EPOCHS, "must be >= 0")
    _need(0 <= sol.MOMENTUM < 1, "SOLVER.MOMENTUM", sol.MOMENTUM, "must be in [0, 1)")
    _need(sol.WEIGHT_DECAY >= 0, "SOLVER.WEIGHT_DECAY", sol.WEIGHT_DECAY, "must be >= 0")
    _need(sol.LARS_ETA > 0, "SOLVER.LARS_ETA", sol.LARS_ETA, "must be > 0")
    for key in ("CHECKPOINT_PERIOD", "LOG_PERIOD"):
        _need(sol[key] > 0, f"SOLVER.{key}", sol[key], "must be > 0 (iterations)")
    _need(sol.MAX_TO_KEEP >= 0, "SOLVER.MAX_TO_KEEP", sol.MAX_TO_KEEP, "must be >= 0")
    _one_of(sol.AMP, "PRECISION", "SOLVER.AMP", AMP_PRECISIONS)
    _one_of(sol.COMPILE, "MODE", "SOLVER.COMPILE", COMPILE_MODES)
    _one_of(sol.COMPILE, "BACKEND", "SOLVER.COMPILE", COMPILE_BACKENDS)


def _check_batch_split(batch: int, world_size: int) -> None:
    _need(batch % world_size == 0, "SOLVER.IMS_PER_BATCH", batch,
          f"must be divisible by the number of processes ({world_size})")  # fmt: skip


def check_world_size(cfg: CN, world_size: int) -> None:
    """The checks that depend on the number of processes: the global batch splits evenly among
    them, and each process's key batch into non-empty BN groups."""
    batch, splits = cfg.SOLVER.IMS_PER_BATCH, cfg.MODEL.KEY_BN_SPLITS
    _check_batch_split(batch, world_size)
    _need(splits >= 1, "MODEL.KEY_BN_SPLITS", splits, "must be >= 1")
    shuffled = cfg.MODEL.SHUFFLE_BN and splits * world_size > 1  # ShuffleBN's groups
    _need(not shuffled or batch // world_size >= splits, "MODEL.KEY_BN_SPLITS", splits,
          f"leaves empty BN groups of the {batch // world_size} images per process "
          f"(SOLVER.IMS_PER_BATCH {batch} over {world_size} processes)")  # fmt: skip
    check_batchnorm_batch(cfg, world_size)


# BatchNorm in training normalises each channel over the images of its batch: one image of a 1x1
# map (a ResNet's last stage at small crops) is no statistic at all, and torch refuses it.
MIN_IMAGES_PER_BN_BATCH = 2


def check_batchnorm_batch(cfg: CN, world_size: int) -> None:
    """Every training BatchNorm batch (a process's images, or each of its ShuffleBN key groups)
    holds at least :data:`MIN_IMAGES_PER_BN_BATCH` images: SOLVER.IMS_PER_BATCH at least that
    many per process and group."""
    shuffled = cfg.MODEL.SHUFFLE_BN and cfg.MODEL.KEY_BN_SPLITS * world_size > 1
    groups = cfg.MODEL.KEY_BN_SPLITS if shuffled else 1
    least = MIN_IMAGES_PER_BN_BATCH * world_size * groups
    per = f" x {world_size} processes" if world_size > 1 else ""
    per += f" x {groups} MODEL.KEY_BN_SPLITS groups" if groups > 1 else ""
    batch = cfg.SOLVER.IMS_PER_BATCH
    _need(least <= batch, "SOLVER.IMS_PER_BATCH", batch,
          f"must be at least {least} ({MIN_IMAGES_PER_BN_BATCH} images{per}): BatchNorm in "
          "training normalises over each process's batch, which needs more than one "
          "image")  # fmt: skip


def _check_datasets(data: CN) -> None:
    _one_of(data, "TYPE", "DATASETS", DATASET_TYPES)
    _need(bool(data.ROOT), "DATASETS.ROOT", data.ROOT, "must name a dataset root")
    _need(data.MAX_IMAGES >= 0, "DATASETS.MAX_IMAGES", data.MAX_IMAGES, "must be >= 0 (0: all)")
    _need(data.TYPE != IMAGEFILES or not data.CLASS_LIST, "DATASETS.CLASS_LIST", data.CLASS_LIST,
          f"DATASETS.TYPE {IMAGEFILES} has no classes to restrict (use imagefolder)")  # fmt: skip


def _check_test(test: CN, dataset_type: str) -> None:
    if test.KNN_PERIOD <= 0:
        return
    _need(dataset_type == FASHION_MNIST or bool(test.KNN_ROOT), "TEST.KNN_ROOT", test.KNN_ROOT,
          f"the kNN monitor (TEST.KNN_PERIOD > 0) of an {dataset_type} run needs a labelled root "
          "with train/ and val/ class folders (or TEST.KNN_PERIOD 0)")  # fmt: skip
    for key in ("KNN_TRAIN_IMAGES", "KNN_TEST_IMAGES", "KNN_K", "KNN_BATCH_SIZE", "KNN_T"):
        _need(test[key] > 0, f"TEST.{key}", test[key], "must be > 0")
