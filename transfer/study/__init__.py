"""The study: `make study` (LORAC vs MoCo-M vs MoCo-v2 at demo scale, several seeds), its sweeps
and the paper's experiments, run here or as SLURM jobs, from each run's pretraining and evaluation
(kNN, linear probe, test nuclear norm) to its record, statistics, figures and page.

May import: :mod:`transfer.analysis` (the nuclear-norm statistic, plots, the paper's tables, the
report's tables and sections), :mod:`transfer.classification` (features, linear probe),
:mod:`pretrain.cluster` (SLURM jobs, ``--executor slurm``), :mod:`pretrain.config`,
:mod:`pretrain.data`, :mod:`pretrain.engine` (the trainer), :mod:`pretrain.evaluation`,
:mod:`pretrain.utils`, :mod:`transfer.tables`, :mod:`transfer.shipped_configs`. Only
``transfer.cli`` and ``tools/`` import it; nothing in ``transfer.analysis`` does.
"""

from .config import load_method_configs
from .driver import RunOutcome, StudyInterrupted, run_study
from .experiments import METHODS, Method, StudyError, StudyOptions
from .page import write_report

__all__ = [
    "METHODS",
    "Method",
    "RunOutcome",
    "StudyError",
    "StudyInterrupted",
    "StudyOptions",
    "load_method_configs",
    "run_study",
    "write_report",
]
