"""Pretraining data: image sources, samplers, crops on the host and colour augmentation on the
device.

May import: :mod:`pretrain.utils` (errors, pixels, and the loaders' ``worker_init_fn``,
:func:`pretrain.utils.signals.shield_data_worker`), :mod:`pretrain.config` (the valid values of
DATASETS.TYPE; whether the step is static).
"""
