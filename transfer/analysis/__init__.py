"""Analysis of pretrained models and of finished experiments (paper Fig. 3-4, Tables 1-5): the
nuclear-norm statistic (:mod:`.nuclear_norm_stats`), the HTML + Markdown report (:mod:`.report`)
with the paper's tables (:mod:`.paper_tables`) and the figures (:mod:`.plots`); a study's
sections come from its caller (:mod:`transfer.study.page`).

Every input file problem raises :class:`AnalysisError` (the result readers'
:class:`~pretrain.utils.errors.ResultsError`) naming the file.

May import: :mod:`pretrain.utils`, :mod:`pretrain.config`, :mod:`pretrain.data`,
:mod:`pretrain.evaluation`, :mod:`pretrain.losses`, :mod:`pretrain.modeling`,
:mod:`transfer.checkpoint`, :mod:`transfer.tables`, :mod:`transfer.metrics_json`,
:mod:`transfer.shipped_configs`, :mod:`transfer.classification` (the evaluation transform) and
:mod:`transfer.detection` (Table 4's results); never ``transfer.study`` or ``transfer.cli``,
which stand above it and import it.
"""

from pretrain.utils.errors import ResultsError

AnalysisError = ResultsError

__all__ = ["AnalysisError"]
