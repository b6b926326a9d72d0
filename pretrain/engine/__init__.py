"""The pretraining loop on detectron2's engine: trainer, hooks, checkpointing, launch.

May import: :mod:`pretrain.utils`, :mod:`pretrain.losses` (the step counter takes a GPU's
nuclear-norm solver), :mod:`pretrain.config`, :mod:`pretrain.data`, :mod:`pretrain.modeling`,
:mod:`pretrain.solver`, :mod:`pretrain.evaluation` (the kNN monitor hook). Not
``pretrain.cluster`` or ``pretrain.cli``: they run the engine.
"""
