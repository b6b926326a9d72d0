"""Analysis of pretrained models and of finished experiments (paper Fig. 3-4, Tables 1-5).

* :mod:`.nuclear_norm_stats`: ||Q_hat||_* of 32 augmentations per test image through a run's
  query encoder, the beta sweep and accuracy vs nuclear norm (``tools/analyze_nuclear_norm.py``).
* :mod:`.report`: one HTML + Markdown report of pretraining runs, evaluation tables and figures
  (``tools/make_report.py``); :mod:`.results` finds the tables the evaluation tools wrote and
  :mod:`.paper_tables` holds the paper's numbers.
* :mod:`.plots` draws every figure (matplotlib, Agg backend) and returns what it plotted.
* The study's records and pages (``make study``, ``docs/results*.md``): :mod:`.study_setup`
  (what a study is: methods, sweeps, options), :mod:`.study_records` (its JSON records, read
  back), :mod:`.study_stats` (means, seed-paired differences), :mod:`.study_comparison` (LORAC
  vs MoCo-M in words and tables), :mod:`.study_figures` and :mod:`.study_page` (the Markdown
  page). The driver that runs a study, :mod:`transfer.study`, sits above and asks these to
  render; the HTML report shows the same comparison from the same records.

Every input file problem raises :class:`AnalysisError` naming the file (and row or key); a bad
study record raises :class:`.study_setup.StudyError`, which the report turns into one. It is
:class:`pretrain.utils.errors.ResultsError` under the name the analysis tools use: the analysis
reads results (tables, ``metrics.json``) with the readers of :mod:`pretrain.utils.tables` and
:mod:`transfer.metrics_json`, which raise it.

May import: :mod:`pretrain.utils`, :mod:`pretrain.config`, :mod:`pretrain.data`,
:mod:`pretrain.evaluation`, :mod:`pretrain.losses`, :mod:`pretrain.modeling`,
:mod:`pretrain.checkpoint`, :mod:`transfer.metrics_json`, :mod:`transfer.classification` (the
evaluation transform) and :mod:`transfer.detection` (Table 4's results); never ``transfer.study``
or ``transfer.cli``, which stand above it and import it.
"""

from pretrain.utils.errors import ResultsError

AnalysisError = ResultsError

__all__ = ["AnalysisError"]
