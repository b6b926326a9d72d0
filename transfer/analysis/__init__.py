"""Analysis of pretrained models and of finished experiments (paper Fig. 3-4, Tables 1-5).

* :mod:`.nuclear_norm_stats`: ||Q_hat||_* of 32 augmentations per test image through a run's
  query encoder, the beta sweep and accuracy vs nuclear norm (``tools/analyze_nuclear_norm.py``).
* :mod:`.report`: one HTML + Markdown report of pretraining runs, evaluation tables and figures
  (``tools/make_report.py``); :mod:`.results` finds the tables the evaluation tools wrote and
  :mod:`.paper_tables` holds the paper's numbers.
* :mod:`.plots` draws every figure (matplotlib, Agg backend) and returns what it plotted.

Every input file problem raises :class:`AnalysisError` naming the file (and row or key). It is
:class:`pretrain.utils.errors.ResultsError` under the name the analysis tools use: the analysis
reads
results (tables, ``metrics.json``) with the readers of :mod:`pretrain.utils.tables` and
:mod:`transfer.metrics_json`, which raise it.
"""

from pretrain.utils.errors import ResultsError

AnalysisError = ResultsError

__all__ = ["AnalysisError"]
