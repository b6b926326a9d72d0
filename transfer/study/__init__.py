"""`make study`: LORAC vs MoCo-M vs MoCo-v2 at demo scale, several seeds, three evaluations.

Each (method, seed) run is pretrained with the project's engine, then evaluated with the project's
own kNN (:func:`transfer.classification.demo.knn_features`, :mod:`pretrain.evaluation.knn`), a
linear probe on the same frozen features (the transfer harness's classifier,
:func:`transfer.classification.linear.train_linear_heads`) and test nuclear-norm statistic
(:func:`transfer.analysis.nuclear_norm_stats.augmented_nuclear_norms`, paper Fig. 4c); the
results go to ``<run>/study.json`` and, once every run is done, to a Markdown report and a plot.
See ``docs/results.md`` for a report and ``tools/study.py`` for the command line.
"""

from .config import METHODS, Method, StudyError, StudyOptions, load_method_configs
from .driver import RunOutcome, StudyInterrupted, run_study
from .report import summarize, verdict, write_report

__all__ = [
    "METHODS",
    "Method",
    "RunOutcome",
    "StudyError",
    "StudyInterrupted",
    "StudyOptions",
    "load_method_configs",
    "run_study",
    "summarize",
    "verdict",
    "write_report",
]
