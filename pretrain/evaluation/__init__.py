"""Evaluation used while pretraining and after it: the one feature extractor and weighted kNN.

May import: :mod:`pretrain.utils`, :mod:`pretrain.config`, :mod:`pretrain.data`.
"""
