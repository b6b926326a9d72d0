"""The kNN hook: lives in :mod:`pretrain.evaluation.knn_hook`; re-exported for transfer/."""

from pretrain.evaluation.knn_hook import *  # noqa: F403
from pretrain.evaluation.knn_hook import __all__  # noqa: F401
