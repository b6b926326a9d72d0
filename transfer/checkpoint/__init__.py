"""Checkpoints to evaluate: reading every supported public layout (``reader``, ``layouts``), safe
unpickling (``safe_pickle``), ResNet key names (``resnet_names``), the weights' hash
(``digest``) and what a checkpoint's run says about it (``provenance``).

May import: :mod:`pretrain.utils`, :mod:`pretrain.modeling` (to build the encoder a layout names),
:mod:`transfer.tables` (the layouts' table in the docs).
"""
