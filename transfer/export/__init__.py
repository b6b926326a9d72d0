"""Pretrained backbones for use outside this project: torchvision / timm state dicts, and the
weights ``hubconf.py`` loads. Imports :mod:`pretrain` (the checkpoint reader, atomic writes);
nothing in :mod:`pretrain` imports this package."""

from transfer.export import backbone
from transfer.export.backbone import (
    EXPORT_FORMATS,
    ExportError,
    ExportReport,
    export_backbone,
    export_metadata,
    export_state_dict,
    is_same_file,
    read_backbone,
)

__all__ = backbone.__all__
