"""Checkpoints on disk: reading every supported layout (``reader``, ``layouts``), safe unpickling
(``safe_pickle``) and ResNet key names (``resnet_names``). Writing goes through
:func:`pretrain.utils.atomic_io.atomic_replace`.

May import: :mod:`pretrain.utils`, :mod:`pretrain.modeling` (to build the encoder a layout names).
"""
