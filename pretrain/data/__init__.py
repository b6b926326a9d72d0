"""Pretraining data: image sources, samplers, crops on the host and colour augmentation on the
device.

May import: :mod:`pretrain.utils`, :mod:`pretrain.cluster.distributed` (rank and world size).
"""
