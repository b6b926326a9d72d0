"""Instruments that measure the training step, for benchmarks and tests (never run by a run): the
op counter, one step counted with it, CUDA's own sync report, the CPU bfloat16 conv fault count.

May import: :mod:`pretrain.utils`, :mod:`pretrain.losses` (the step counter takes a GPU's
nuclear-norm solver), :mod:`pretrain.config`, :mod:`pretrain.engine` (the trainer it measures).
"""
