"""The pretraining loop on detectron2's engine: trainer, hooks, checkpointing, launch.

May import: :mod:`pretrain.utils`, :mod:`pretrain.config`, :mod:`pretrain.data`,
:mod:`pretrain.modeling`, :mod:`pretrain.solver`, :mod:`pretrain.evaluation` (the kNN monitor
hook). Not ``pretrain.cluster`` or ``pretrain.cli``: they run the engine; not
``pretrain.diagnostics``: the instruments measure the engine from above.
"""
