"""LORAC pretraining: produces checkpoints; never imports :mod:`transfer`.

Rooms, bottom to top (docs/layout.md draws the tree):

* ``utils``: errors, tables, atomic writes, constants, run set-up.
* ``config``: defaults, validation, strict YAML loading.
* ``losses``: the method: the LORAC loss object and functions, the priors, the nuclear norm.
* ``checkpoint``: reading every supported checkpoint layout, safe unpickling, ResNet key names.
* ``data``: sources, samplers, crops and colour augmentation.
* ``modeling``: encoders and the multi-view MoCo model that holds the loss.
* ``solver``: LARS and learning-rate schedules.
* ``evaluation``: feature extraction and weighted kNN, also as a training monitor.
* ``engine``: the trainer on detectron2's engine, hooks, checkpointing, launch.
* ``cluster``: torch.distributed set-up, preemption, SLURM jobs through submitit.
* ``cli``: the command-line tools' ``main`` functions.

The modules that stood at this package's root until 2026-11 (``pretrain.losses`` as a module,
``pretrain.config_io``, ``pretrain.checkpoint_io``, ...) still import under their old names, as the
same module objects, with a ``DeprecationWarning``; the old names go in the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# Old module name (deprecated) -> the module that now holds its code.
_MOVED = {
    "pretrain.errors": "pretrain.utils.errors",
    "pretrain.tables": "pretrain.utils.tables",
    "pretrain.atomic_io": "pretrain.utils.atomic_io",
    "pretrain.constants": "pretrain.utils.constants",
    "pretrain.run_setup": "pretrain.utils.run_setup",
    "pretrain.config_io": "pretrain.config.strict",
    "pretrain.config_files": "pretrain.config.files",
    "pretrain.checkpoint_io": "pretrain.checkpoint.reader",
    "pretrain.checkpoint_layouts": "pretrain.checkpoint.layouts",
    "pretrain.safe_pickle": "pretrain.checkpoint.safe_pickle",
    "pretrain.resnet_names": "pretrain.checkpoint.resnet_names",
    "pretrain.priors": "pretrain.losses.priors",
    "pretrain.nuclear_norm": "pretrain.losses.nuclear",
    # one kNN monitor module, free of the trainer
    "pretrain.engine.knn_monitor": "pretrain.evaluation.knn_monitor",
    "pretrain.evaluation.knn_hook": "pretrain.evaluation.knn_monitor",
    # the demo evaluates (kNN, baselines): the transfer side's job since 2026-11
    "pretrain.demo": "transfer.classification.demo",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a deprecated module name as the module that replaced it (the same object).

    A meta-path finder rather than stub files, because a stub would be a second module object:
    ``mock.patch`` on it, or ``isinstance`` checks on its classes, would silently miss.
    """

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201
        if fullname not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = _MOVED[spec.name]
        warnings.warn(
            f"{spec.name} is deprecated and will be removed in the next release; import {new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # already executed under its new name


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())
