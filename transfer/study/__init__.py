"""`make study`: LORAC vs MoCo-M vs MoCo-v2 at demo scale, several seeds; and the paper's
experiments as data (:mod:`.experiments`), run here or as SLURM jobs (:mod:`.slurm`). Each
(method, seed) run is pretrained, then evaluated by kNN, a linear probe on the same frozen
features and the test nuclear-norm statistic (paper Fig. 4c); once every run is done the analysis
layer writes the page (:mod:`transfer.analysis.study_page`, e.g. ``docs/results.md``).

May import: :mod:`transfer.analysis` (what a study is, its records, page and figures, the
nuclear-norm statistic), :mod:`transfer.classification` (features, linear probe),
:mod:`pretrain.cluster` (SLURM jobs, ``--executor slurm``), :mod:`pretrain.config`,
:mod:`pretrain.data`, :mod:`pretrain.engine` (the trainer), :mod:`pretrain.evaluation`,
:mod:`pretrain.utils`, :mod:`transfer.tables`, :mod:`transfer.shipped_configs`. Only
``transfer.cli`` and ``tools/`` import it; nothing in ``transfer.analysis`` does.
"""

from transfer.analysis.study_setup import METHODS, Method, StudyError, StudyOptions

from .config import load_method_configs
from .driver import RunOutcome, StudyInterrupted, run_study
from .report import write_report

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
