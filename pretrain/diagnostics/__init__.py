"""Measuring instruments for the training step, used by the benchmarks and the tests, never by a
run: the op counter (what CPU code would ask of a GPU), one step counted with it, CUDA's own sync
report, and the CPU bfloat16 conv fault counter.

May import: :mod:`pretrain.utils`, :mod:`pretrain.losses` (the step counter takes a GPU's
nuclear-norm solver), :mod:`pretrain.config`, :mod:`pretrain.engine` (the trainer it measures).
"""
