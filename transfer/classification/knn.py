"""Weighted kNN: lives in :mod:`pretrain.evaluation.knn` (the kNN monitor of pretraining uses it
too, and pretrain/ imports nothing from transfer/); re-exported here for the transfer tools."""

from pretrain.evaluation.knn import *  # noqa: F403
from pretrain.evaluation.knn import __all__  # noqa: F401
