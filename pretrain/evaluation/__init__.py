"""Evaluation used while pretraining and after it: the one feature extractor and weighted kNN.

May import: :mod:`pretrain.utils`, :mod:`pretrain.config`, :mod:`pretrain.data`,
:mod:`pretrain.cluster.preemption` (its data workers ignore the stop signals, as the loader's).
"""
