"""`make study`: LORAC vs MoCo-M vs MoCo-v2 at demo scale, several seeds, three evaluations; and
the paper's experiments as data (:mod:`.experiments`), run here or as SLURM jobs (:mod:`.slurm`).

The driver on top of the evaluation side: each (method, seed) run is pretrained with the
project's engine, then evaluated with the project's own kNN
(:func:`transfer.classification.demo.knn_features`, :mod:`pretrain.evaluation.knn`), a linear
probe on the same frozen features (the transfer harness's classifier,
:func:`transfer.classification.linear.train_linear_heads`) and the test nuclear-norm statistic
(:func:`transfer.analysis.nuclear_norm_stats.augmented_nuclear_norms`, paper Fig. 4c); the
results go to ``<run>/study.json`` and the records, and, once every run is done, the analysis
layer writes the Markdown page and its plots from them (:mod:`transfer.analysis.study_page`).
See ``docs/results.md`` for a page and ``tools/study.py`` for the command line.

May import: :mod:`transfer.analysis` (what a study is, its records, page and figures, the
nuclear-norm statistic), :mod:`transfer.classification` (features, linear probe),
:mod:`pretrain.cluster` (SLURM jobs, ``--executor slurm``), :mod:`pretrain.config`,
:mod:`pretrain.data`, :mod:`pretrain.engine` (the trainer),
:mod:`pretrain.evaluation`, :mod:`pretrain.utils`. Only ``transfer.cli`` and ``tools/`` import
it; nothing in ``transfer.analysis`` does.
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
