"""Evaluation used while pretraining and after it: the one feature extractor and weighted kNN.

May import: :mod:`pretrain.utils` (its data workers ignore the stop signals, as the loader's),
:mod:`pretrain.config`, :mod:`pretrain.data`.
"""
