"""Read a ResNet backbone out of a checkpoint, whatever tool or release wrote it.

The layouts understood (this project's, MoCo/LORAC, torchvision, SwAV, DINO, solo-learn, VISSL,
converted SimCLR and BYOL, detectron2) are the table :data:`transfer.checkpoint.layouts.LAYOUTS`,
documented in ``docs/checkpoints.md``; each is recognised from its keys, never by fuzzy matching.
When several layouts match and give different tensors the file is refused as ambiguous, naming
the candidates; when none matches the error names the file and every known layout.

The result always has exactly the keys of a torchvision ResNet without ``fc`` (verified against
the architecture inferred from the weights); anything missing or left over raises
:class:`CheckpointError` naming the keys. ``.pkl`` files (detectron2) are read by a restricted
unpickler that builds only numpy arrays; everything else, and a ``torch.save`` file whatever its
name, with ``torch.load(weights_only=True)``; a TorchScript archive is refused, naming what to
give instead.
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import zipfile
from dataclasses import dataclass, field

import numpy as np
import torch
import torchvision

from pretrain.utils.errors import CheckpointError  # noqa: F401 (re-exported)
from pretrain.utils.torch_files import incomplete_torch_file
from transfer.checkpoint.layouts import LAYOUTS, Match, find_matches
from transfer.checkpoint.safe_pickle import UnsafePickleError, load_safe_pickle

__all__ = [
    "D2_TORCHVISION_AUTHORS",
    "BackboneWeights",
    "CheckpointError",
    "extract_backbone",
    "infer_resnet_arch",
    "load_backbone",
    "load_checkpoint_file",
    "load_pickle_weights",
]

# detectron2 files whose ResNet is known to have torchvision's stride placement: written by this
# project's converter ("lorac") or detectron2's convert-torchvision-to-d2.py ("torchvision").
D2_TORCHVISION_AUTHORS = ("lorac", "torchvision")

_DEPTHS = {  # blocks per stage -> (arch, bottleneck?)
    (2, 2, 2, 2, False): "resnet18",
    (3, 4, 6, 3, False): "resnet34",
    (3, 4, 6, 3, True): "resnet50",
    (3, 4, 23, 3, True): "resnet101",
    (3, 8, 36, 3, True): "resnet152",
}


@dataclass
class BackboneWeights:
    """A torchvision-keyed ResNet backbone state dict (no ``fc``) and where it came from."""

    state_dict: dict[str, torch.Tensor]
    arch: str
    source_format: str
    dropped: list[str] = field(default_factory=list)  # input keys dropped on purpose
    path: str = ""
    filled: list[str] = field(default_factory=list)  # keys absent from the file, set to 0
    stem: str = "imagenet"  # "small": 3x3 stride-1 conv1, no max-pool (pretrain.modeling.encoder)

    @property
    def layout(self) -> str:
        """Name of the layout in :data:`transfer.checkpoint.layouts.LAYOUTS` that was found."""
        return self.source_format

    def describe(self) -> str:
        """One line for logs: ``file: <layout> layout, <arch>``."""
        return f"{self.path}: {self.source_format} layout, {self.arch}"


def _numpy_to_torch(obj: object) -> object:
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        # not np.ascontiguousarray: it turns 0-d arrays (num_batches_tracked) into shape (1,)
        return torch.from_numpy(obj if obj.flags.c_contiguous else obj.copy())
    if isinstance(obj, dict):
        return {k: _numpy_to_torch(v) for k, v in obj.items()}
    return obj


def load_pickle_weights(path: str) -> dict:
    """A detectron2-style ``.pkl`` (numpy arrays), read without running code; arrays -> tensors."""
    try:
        obj = load_safe_pickle(path)
    except UnsafePickleError as e:
        raise CheckpointError(str(e)) from None
    except pickle.UnpicklingError as e:
        raise CheckpointError(f"{path}: not a readable weights pickle ({e})") from None
    except Exception as e:  # noqa: BLE001 - pickle raises many types on garbage input
        raise CheckpointError(
            f"{path}: not a readable weights pickle ({type(e).__name__})"
        ) from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict, found {type(obj).__name__}")
    return _numpy_to_torch(obj)


_UNSUPPORTED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")


def _reference_backbone(arch: str, stem: str) -> torch.nn.Module:
    """An untrained torchvision ``arch`` with ``stem``, its ``fc`` replaced by ``Identity``."""
    from pretrain.modeling.encoder import set_stem

    model = set_stem(torchvision.models.__dict__[arch](), stem)
    model.fc = torch.nn.Identity()
    return model


def _torch_zip_members(path: str) -> list[str]:
    """The member names of ``path`` when it is a zip archive (``torch.save``'s format and
    TorchScript's), else ``[]``: what a file holds is read from it, not from its suffix."""
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return []
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return []


def load_checkpoint_file(path: str) -> dict:
    """Read a checkpoint without running code from it; one-line errors instead of tracebacks.

    ``torch.load(weights_only=True)``, allowing also ``argparse.Namespace`` (DINO pickles its
    ``args``; a Namespace only sets attributes); ``.pkl`` files go to :func:`load_pickle_weights`.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such checkpoint file")
    if os.path.getsize(path) == 0:
        raise CheckpointError(f"{path}: file is empty, not a checkpoint")
    incomplete = incomplete_torch_file(path)
    if incomplete:
        raise CheckpointError(
            f"{path}: incomplete checkpoint, {incomplete}: the save or copy that wrote it was "
            "cut off; copy or save it again, or name another checkpoint"
        )
    zipped = _torch_zip_members(path)
    if any(name.split("/", 1)[-1] == "constants.pkl" for name in zipped):
        # torch's own test (torch.serialization._is_torchscript_zip); torch.load would warn and
        # hand the file to torch.jit.load, which weights-only loading then refuses
        raise CheckpointError(
            f"{path}: a TorchScript archive (torch.jit.save), not a checkpoint: give the "
            "pretraining checkpoint it was scripted from, or its state dict saved with "
            "torch.save(model.state_dict(), ...)"
        )
    if path.endswith(".pkl") and not zipped:  # a torch file named .pkl is read as one below
        return load_pickle_weights(path)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises many types on garbage input
        # Not torch's own text: it advises weights_only=False, which would run pickled code.
        m = _UNSUPPORTED_GLOBAL.search(str(e))
        why = (
            f"it pickles {m.group(1)}, which weights-only loading refuses; re-save just its "
            "state dict (e.g. torch.save({'state_dict': ckpt['state_dict']}, ...)) in a trusted "
            "environment"
            if m
            else type(e).__name__
        )
        raise CheckpointError(f"{path}: not a readable PyTorch checkpoint ({why})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict, found {type(obj).__name__}")
    return obj


def infer_resnet_arch(sd: dict[str, torch.Tensor]) -> str:
    """Name of the torchvision ResNet whose backbone keys ``sd`` has; raises if none fits."""
    blocks = []
    for stage in range(1, 5):
        ids = {int(k.split(".")[1]) for k in sd if k.startswith(f"layer{stage}.")}
        blocks.append(max(ids) + 1 if ids else 0)
    bottleneck = any(k.endswith("conv3.weight") for k in sd)
    arch = _DEPTHS.get((*blocks, bottleneck))
    if arch is None:
        raise CheckpointError(
            f"weights do not match a torchvision ResNet (blocks per stage {blocks}, "
            f"bottleneck={bottleneck}); is there a backbone in this checkpoint?"
        )
    return arch


def known_layouts() -> str:
    """The layout names, for error messages."""
    return ", ".join(layout.name for layout in LAYOUTS)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and torch.equal(a[k], b[k]) for k in a
    )


def _check_d2_stride_placement(obj: dict, found: Match, path: str) -> None:
    """Refuse detectron2 weights other than converted backbones: a detectron2 model's ResNet may
    put the stride in the 1x1 conv (``MODEL.RESNETS.STRIDE_IN_1X1``), which the names cannot
    show, and read as torchvision's it would give other features without an error."""
    author = obj.get("__author__")
    if author in D2_TORCHVISION_AUTHORS:
        return
    others = found.dropped
    held = (
        f"keys besides the ResNet: {', '.join(others[:4])}"
        + (f" ... ({len(others)} in all)" if len(others) > 4 else "")
        if others
        else "no keys besides the ResNet"
    )
    raise CheckpointError(
        f"{path}: detectron2 layout, __author__ {author!r} ({held}): a detectron2 model's "
        "ResNet may put the stride in the 1x1 conv (MODEL.RESNETS.STRIDE_IN_1X1), which the "
        "weights cannot show, so only converted backbones (__author__ "
        f"{' or '.join(map(repr, D2_TORCHVISION_AUTHORS))}) are read; use the pretraining "
        "checkpoint it started from instead"
    )


def extract_backbone(obj: dict, path: str = "<state>") -> BackboneWeights:
    """Find the backbone in a loaded checkpoint dict (layouts: ``docs/checkpoints.md``)."""
    matches = find_matches(obj)
    if not matches:
        raise CheckpointError(
            f"{path}: no ResNet backbone in a known layout (known: {known_layouts()}; see "
            f"docs/checkpoints.md); top-level keys: {sorted(map(str, obj))[:6]}"
        )
    distinct = [m for i, m in enumerate(matches) if not any(
        _same(m.state_dict, o.state_dict) for o in matches[:i]
    )]  # fmt: skip
    if len(distinct) > 1:
        where = ", ".join(
            f"{m.layout.name} ({'/'.join(m.place[0]) or 'top level'}: {m.place[1] or 'no prefix'})"
            for m in distinct
        )
        raise CheckpointError(
            f"{path}: ambiguous checkpoint: layouts {where} all match with different weights; "
            "save the one backbone you mean on its own"
        )
    found = matches[0]
    if found.layout.refuse:
        raise CheckpointError(f"{path}: {found.layout.name} layout: {found.layout.refuse}")
    if found.layout.naming == "detectron2":
        _check_d2_stride_placement(obj, found, path)
    fmt, sd, dropped = found.layout.name, dict(found.state_dict), list(found.dropped)
    filled = []
    if found.layout.naming == "detectron2":
        # detectron2's FrozenBatchNorm2d has no num_batches_tracked; it is unused in eval mode.
        for key in [k for k in sd if k.endswith(".running_var")]:
            counter = key[: -len("running_var")] + "num_batches_tracked"
            if counter not in sd:
                sd[counter] = torch.tensor(0, dtype=torch.long)
                filled.append(counter)
    try:
        arch = infer_resnet_arch(sd)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {fmt} layout: {e} (known: {known_layouts()})") from None
    # The stem is read off conv1's kernel: 3x3 is the small stem, anything else is checked
    # against torchvision's 7x7 below.
    conv1 = sd.get("conv1.weight")
    stem = "small" if conv1 is not None and tuple(conv1.shape[-2:]) == (3, 3) else "imagenet"
    reference = _reference_backbone(arch, stem).state_dict()
    expected = set(reference)
    missing, unused = sorted(expected - set(sd)), sorted(set(sd) - expected)
    if missing or unused:
        raise CheckpointError(
            f"{path}: {fmt} layout: backbone keys do not match torchvision {arch}: missing "
            f"{missing[:10]}{' ...' if len(missing) > 10 else ''}, unmapped {unused[:10]}"
            f"{' ...' if len(unused) > 10 else ''} (known layouts: {known_layouts()})"
        )
    bad = [k for k in expected if tuple(sd[k].shape) != tuple(reference[k].shape)]
    if bad:
        raise CheckpointError(
            f"{path}: {fmt} layout: shape mismatch vs torchvision {arch} for {bad[:5]}: "
            + ", ".join(f"{k} {tuple(sd[k].shape)} != {tuple(reference[k].shape)}" for k in bad[:3])
        )
    return BackboneWeights(dict(sd), arch, fmt, dropped, path, sorted(filled), stem)


def load_backbone(path: str) -> BackboneWeights:
    """Read ``path`` with ``weights_only=True`` and return its ResNet backbone."""
    return extract_backbone(load_checkpoint_file(path), path)


def build_torchvision_backbone(weights: BackboneWeights) -> torch.nn.Module:
    """A torchvision ResNet with ``fc = Identity`` holding ``weights`` (loaded strictly)."""
    model = _reference_backbone(weights.arch, weights.stem)
    model.load_state_dict(weights.state_dict, strict=True)
    return model
