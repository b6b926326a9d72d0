"""Export a ResNet backbone (any layout :mod:`transfer.checkpoint.reader` reads, in torchvision
names) for torchvision or timm, whose ResNets name their modules alike; the state dict is loaded
``strict=True`` into the target library's model before anything is written. Output
(docs/checkpoints.md): a ``.safetensors`` file with :func:`export_metadata` in its metadata, or a
torch pickle of the plain state dict with the metadata in ``<output>.json``, written atomically.
Refused with one line naming the file: unreadable or unknown files, non-ResNets, the ``small``
3x3 stem (torchvision and timm have no such ResNet) and an output named ``*.pkl`` (detectron2's
pickle format, which ``tools/convert_to_d2.py`` writes).
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field

import torch

from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.errors import CheckpointError, LoracError
from transfer.checkpoint.reader import (
    BackboneWeights,
    build_torchvision_backbone,
    extract_backbone,
    load_checkpoint_file,
)

__all__ = [
    "EXPORT_FORMATS",
    "ExportError",
    "ExportReport",
    "export_backbone",
    "export_metadata",
    "export_state_dict",
    "is_same_file",
    "read_backbone",
]

EXPORT_FORMATS = ("torchvision", "timm")
METADATA_FORMAT = "lorac-backbone"  # the "format" entry of every export's metadata
SAFETENSORS_SUFFIX = ".safetensors"
SIDECAR_SUFFIX = ".json"  # a pickle's metadata: <output>.json
D2_PICKLE_SUFFIX = ".pkl"  # detectron2's weights pickles: not a name an export may take


class ExportError(LoracError):
    """A backbone that cannot be exported as asked; the message names the file (and keys)."""


@dataclass
class ExportReport:
    """What :func:`export_backbone` did."""

    input_path: str
    output_path: str
    arch: str
    layout: str
    format: str
    num_tensors: int
    metadata: dict[str, str]
    metadata_path: str  # where the metadata is: the output itself (safetensors) or the sidecar
    dropped: list[str] = field(default_factory=list)


def _progress(obj: dict) -> dict[str, str]:
    """``iteration`` (or Lightning's ``global_step``) and ``epoch`` as the checkpoint records
    them, "unknown" where it does not."""

    def number(key: str) -> str | None:
        value = obj.get(key)
        if torch.is_tensor(value) and value.numel() == 1:
            value = value.item()
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return None

    iteration = number("iteration") or number("global_step")
    return {"iteration": iteration or "unknown", "epoch": number("epoch") or "unknown"}


def _read_safetensors(path: str) -> tuple[dict, dict[str, str]]:
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        with safe_open(path, framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not a dict)
    except Exception as e:  # noqa: BLE001 - safetensors raises several types on garbage input
        raise CheckpointError(
            f"{path}: not a readable safetensors file ({type(e).__name__})"
        ) from None
    return tensors, meta


def read_backbone(path: str) -> tuple[BackboneWeights, dict[str, str]]:
    """The backbone in ``path`` (any checkpoint the reader reads, or an export's
    ``.safetensors``) and the training progress it records (``iteration``, ``epoch``)."""
    if path.endswith(SAFETENSORS_SUFFIX):
        tensors, meta = _read_safetensors(path)
        progress = {k: meta.get(k, "unknown") for k in ("iteration", "epoch")}
        return extract_backbone(tensors, path), progress
    obj = load_checkpoint_file(path)
    return extract_backbone(obj, path), _progress(obj)


def export_state_dict(
    weights: BackboneWeights, fmt: str = "torchvision"
) -> dict[str, torch.Tensor]:
    """The backbone as ``fmt``'s ResNet names it, checked by a ``strict=True`` load into that
    library's model (``fc`` dropped); :class:`ExportError` naming the file and keys otherwise."""
    if fmt not in EXPORT_FORMATS:
        raise ExportError(f"--format {fmt!r}: expected one of {list(EXPORT_FORMATS)}")
    if weights.stem != "imagenet":
        raise ExportError(
            f"{weights.path}: {weights.layout} layout, {weights.arch} with the {weights.stem!r} "
            "stem (3x3 stride-1 conv1 (conv1.weight (64, 3, 3, 3)), no max-pool): torchvision's "
            f"and timm's {weights.arch} have a 7x7 stride-2 conv1 and a max-pool, so no model of "
            "theirs holds these weights"
        )
    # timm and torchvision ResNets share every name: one dict, checked against the target's model
    state = {k: v.detach().cpu().contiguous() for k, v in weights.state_dict.items()}
    try:
        if fmt == "timm":
            import timm

            timm.create_model(weights.arch, pretrained=False, num_classes=0).load_state_dict(
                state, strict=True
            )
        else:
            build_torchvision_backbone(weights)  # torchvision's arch, fc = Identity, strict
    except RuntimeError as e:
        raise ExportError(
            f"{weights.path}: {weights.arch} does not load strictly into {fmt}'s model: "
            f"{' '.join(str(e).split())[:400]}"
        ) from None
    return state


def export_metadata(weights: BackboneWeights, progress: dict[str, str], fmt: str) -> dict[str, str]:
    """What an exported file records about itself (str -> str, as safetensors requires)."""
    return {
        "format": METADATA_FORMAT,
        "target": fmt,
        "arch": weights.arch,
        "source_file": os.path.basename(weights.path),
        "source_layout": weights.layout,
        "iteration": progress.get("iteration", "unknown"),
        "epoch": progress.get("epoch", "unknown"),
    }


def is_same_file(a: str, b: str) -> bool:
    """Whether paths ``a`` and ``b`` name the same file (through links, ``..`` and relative
    paths alike); a path that does not exist is the same as another only by its real path."""
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def export_backbone(
    input_path: str, output_path: str, fmt: str = "torchvision", safetensors: bool = False
) -> ExportReport:
    """Read ``input_path`` and write its backbone for ``fmt`` to ``output_path`` (a
    ``.safetensors`` file with ``safetensors=True``); everything is checked before the first byte
    is written, and on error nothing is left at ``output_path``."""
    if safetensors != output_path.endswith(SAFETENSORS_SUFFIX):
        raise ExportError(
            f"{output_path}: "
            + (
                f"--safetensors writes a {SAFETENSORS_SUFFIX} file; name the output *.safetensors"
                if safetensors
                else f"a {SAFETENSORS_SUFFIX} output needs --safetensors (otherwise it is a "
                "torch pickle)"
            )
        )
    if output_path.endswith(D2_PICKLE_SUFFIX):
        # detectron2 and this project read a .pkl as detectron2's pickle of numpy arrays in
        # detectron2's names, which an export is not: refused rather than written misnamed
        raise ExportError(
            f"{output_path}: a {D2_PICKLE_SUFFIX} file is a detectron2 weights pickle; name the "
            "export *.pth (a torch file) or *.safetensors with --safetensors, or convert for "
            "detectron2 with tools/convert_to_d2.py"
        )
    sidecar = output_path + SIDECAR_SUFFIX
    for out in [output_path] if safetensors else [output_path, sidecar]:
        if is_same_file(input_path, out):
            # the input is the export's provenance (its metadata names it): never replace it
            raise ExportError(
                f"{out}: is the input checkpoint {input_path}; write the export to another file"
            )
    weights, progress = read_backbone(input_path)
    state = export_state_dict(weights, fmt)
    meta = export_metadata(weights, progress, fmt)
    folder = os.path.dirname(os.path.abspath(output_path))
    try:
        os.makedirs(folder, exist_ok=True)
        if safetensors:
            from safetensors.torch import save

            atomic_write_bytes(output_path, save(state, metadata=meta))
            meta_path = output_path
        else:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            meta_path = sidecar
            atomic_write_bytes(output_path, buffer.getvalue())
            try:
                atomic_write_bytes(meta_path, (json.dumps(meta, indent=2) + "\n").encode())
            except BaseException:
                os.unlink(output_path)  # weights without their metadata: none at all
                raise
    except OSError as e:  # an output path that cannot be written
        raise ExportError(f"{output_path}: cannot write ({e.strerror or e})") from None
    return ExportReport(
        input_path=input_path,
        output_path=output_path,
        arch=weights.arch,
        layout=weights.layout,
        format=fmt,
        num_tensors=len(state),
        metadata=meta,
        metadata_path=meta_path,
        dropped=list(weights.dropped),
    )
