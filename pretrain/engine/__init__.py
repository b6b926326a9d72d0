"""The pretraining loop on detectron2's engine: trainer, hooks, checkpointing, launch.

May import: every other room of :mod:`pretrain` (it is the top of the pretraining side).
"""
