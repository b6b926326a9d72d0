"""The checkpoint layouts the backbone reader recognises: one table, read by code, docs and errors.

Each :class:`Layout` says where the backbone tensors sit (a path of nested dict keys, then a name
prefix) and how they are named there (torchvision, detectron2, or the numbered children of
``nn.Sequential(*resnet.children())``). A layout *matches* when, at one of its places, the two
sentinel keys of its naming (the stem conv and the first block's first conv) exist; nothing is
matched by partial or fuzzy key comparison. ``docs/checkpoints.md`` is generated from
:data:`LAYOUTS` (``python -m transfer.checkpoint.layouts``) and a test keeps it in sync.

``source`` says where each layout's key names are documented in public code, or that they are
inferred; read it before trusting a layout with a real release.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from transfer.checkpoint.resnet_names import SEQUENTIAL_CHILDREN, d2_to_torchvision_name
from transfer.tables import markdown_table

__all__ = ["LAYOUTS", "Layout", "Match", "find_matches", "layouts_table"]

# naming -> the two keys that must exist (after the prefix) for a place to match
_SENTINELS = {
    "torchvision": ("conv1.weight", "layer1.0.conv1.weight"),
    "detectron2": ("stem.conv1.weight", "res2.0.conv1.weight"),
    "sequential": ("0.weight", "4.0.conv1.weight"),
    "caffe2": ("conv1_w", "res2_0_branch2a_w"),
}

_D2_RESNET = re.compile(r"^(stem|res[2-5])\.")  # names of detectron2's ResNet (kept, then checked)

Place = tuple[tuple[str, ...], str]  # (nested dict keys from the top, backbone name prefix)


@dataclass(frozen=True)
class Layout:
    """One checkpoint layout: where its backbone is, how it is named, what is dropped."""

    name: str
    releases: str  # who writes this layout
    places: tuple[Place, ...]  # tried in order; the first that matches is used
    naming: str  # a key of _SENTINELS
    source: str  # where the key names are documented publicly, or "inferred: ..."
    heads: tuple[str, ...] = ("fc.",)  # names under the prefix dropped on purpose
    refuse: str = ""  # recognised, but has no exact torchvision equivalent: why

    def recognised_by(self) -> str:
        parts = []
        for container, prefix in self.places:
            where = " → ".join(f"`{c}`" for c in container) or "top level"
            parts.append(f"{where}: `{prefix}{_SENTINELS[self.naming][1]}`")
        return "; or ".join(parts)


@dataclass
class Match:
    """A layout found at one place, with its backbone renamed to torchvision keys (unchecked)."""

    layout: Layout
    place: Place
    state_dict: dict[str, torch.Tensor]
    dropped: list[str]


LAYOUTS: tuple[Layout, ...] = (
    Layout(
        "lorac",
        "this project's pretraining (`tools/train_pretrain.py`)",
        ((("model",), "encoder_q.backbone."),),
        "torchvision",
        "this repository (`pretrain/modeling`)",
    ),
    Layout(
        "moco",
        "MoCo v1/v2 and the public LORAC release",
        ((("state_dict",), "module.encoder_q."),),
        "torchvision",
        "documented: facebookresearch/moco `main_lincls.py` keeps `module.encoder_q.` minus `fc`",
    ),
    Layout(
        "torchvision",
        "torchvision (supervised), Barlow Twins `resnet50.pth`, DINO backbone-only files",
        (((), ""),),
        "torchvision",
        "documented: torchvision ResNet `state_dict()`; Barlow Twins' and DINO's `hubconf.py` "
        "load their files into torchvision's `resnet50`",
    ),
    Layout(
        "swav",
        "SwAV, DeepCluster-v2, SeLa-v2 (facebookresearch/swav)",
        (((), "module."),),
        "torchvision",
        "documented: facebookresearch/swav `hubconf.py` strips `module.` and loads into "
        "torchvision's `resnet50`; `projection_head.`/`prototypes.` from its `src/resnet50.py`",
        heads=("fc.", "projection_head.", "prototypes."),
    ),
    Layout(
        "dino",
        "DINO full checkpoints (`teacher`/`student`); the teacher is used, as DINO's evaluation "
        "does (its `checkpoint_key` default)",
        (
            (("teacher",), "backbone."),
            (("teacher",), "module.backbone."),
            (("student",), "backbone."),
            (("student",), "module.backbone."),
        ),
        "torchvision",
        "documented: facebookresearch/dino `main_dino.py` (`save_dict`; both networks are DDP-"
        "wrapped for a ResNet, which has BatchNorm) and `utils.load_pretrained_weights`",
        heads=("fc.", "head."),
    ),
    Layout(
        "solo-learn",
        "solo-learn Lightning checkpoints (BYOL, Barlow Twins, SimCLR, ... trained with it); "
        "mmselfsup checkpoints have the same shape",
        ((("state_dict",), "backbone."), (("state_dict",), "encoder.")),
        "torchvision",
        "documented: solo-learn `main_linear.py` takes `state_dict`, strips `backbone.` "
        "(older checkpoints: `encoder.`)",
    ),
    Layout(
        "vissl",
        "VISSL model zoo (SimCLR, SwAV, MoCo, Barlow Twins, ... trained with VISSL)",
        ((("classy_state_dict", "base_model", "model", "trunk"), "_feature_blocks."),),
        "torchvision",
        "documented: VISSL checkpoints nest `classy_state_dict` → `base_model` → `model` → "
        "`trunk`; its torchvision export strips `_feature_blocks.`",
    ),
    Layout(
        "simclr-converted",
        "SimCLR v1 TensorFlow checkpoints converted by tonylins/simclr-converter; any "
        "`{'resnet': ...}` file holding torchvision names",
        ((("state_dict",), ""), (("resnet",), "")),
        "torchvision",
        "documented for `state_dict`: tonylins/simclr-converter `convert.py` saves "
        "`{'state_dict': model.state_dict()}` of a torchvision-style ResNet (width 1x only). "
        "`resnet`: Separius/SimCLRv2-Pytorch saves `{'resnet': ..., 'head': ...}` but with its "
        "own module names, which are NOT torchvision names and are refused (inferred: its "
        "`resnet.py` was not read)",
    ),
    Layout(
        "byol",
        "BYOL converted to PyTorch: sthalles/PyTorch-BYOL (`online_network_state_dict`, "
        "`nn.Sequential` numbering); `online_network.encoder.`-prefixed files",
        (
            (("online_network_state_dict",), "encoder."),
            ((), "online_network.encoder."),
            (("state_dict",), "online_network.encoder."),
        ),
        "sequential",
        "documented for `online_network_state_dict`: sthalles/PyTorch-BYOL `trainer.py` "
        "(`save_model`) and `resnet_base_network.py` (`encoder = nn.Sequential(*list("
        "resnet.children())[:-1])`). `online_network.encoder.`: inferred (no public converter "
        "writing it was found); read with the same numbering or torchvision names",
    ),
    Layout(
        "byol-torchvision",
        "BYOL files with torchvision names under `online_network.encoder.` or `backbone.`",
        (
            ((), "online_network.encoder."),
            (("state_dict",), "online_network.encoder."),
            ((), "backbone."),
        ),
        "torchvision",
        "inferred from the layouts the issue lists; no public converter writing exactly these "
        "prefixes was read (mmselfsup/solo-learn files with `state_dict` → `backbone.` are "
        "`solo-learn`)",
    ),
    Layout(
        "detectron2",
        "detectron2 `.pkl`/`.pth`: this project's converter, detectron2's "
        "`convert-torchvision-to-d2.py`, trained detectron2 models",
        (
            (("model",), "backbone.bottom_up."),
            (("model",), "backbone."),
            (("model",), ""),
            ((), "backbone.bottom_up."),
            ((), ""),
        ),
        "detectron2",
        "documented: detectron2 `tools/convert-torchvision-to-d2.py` and `modeling/backbone/"
        "resnet.py`; read back assuming torchvision stride placement (`STRIDE_IN_1X1: False`), "
        "which the names cannot show",
        heads=("stem.fc.", "fc."),
    ),
    Layout(
        "detectron2-caffe2",
        "detectron2 model-zoo MSRA / Caffe2 ResNets (`ImageNetPretrained/MSRA/R-50.pkl`)",
        ((("model",), ""), (("blobs",), ""), ((), "")),
        "caffe2",
        "documented: detectron2 `checkpoint/c2_model_loading.py` (Caffe2 names)",
        refuse="MSRA/Caffe2 ResNets put the stride in the 1x1 conv and keep only frozen BN "
        "scale/bias, so no torchvision ResNet reproduces them; use them in detectron2 directly "
        "(MODEL.WEIGHTS with STRIDE_IN_1X1: True)",
    ),
)


def _container(obj: Mapping, path: tuple[str, ...]) -> Mapping | None:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    return obj if isinstance(obj, Mapping) else None


def _rename(name: str, naming: str) -> str:
    """torchvision name of ``name`` (unchanged when it has none, so validation names it)."""
    if naming == "detectron2":
        return d2_to_torchvision_name(name) or name
    if naming == "sequential":
        head, _, rest = name.partition(".")
        if head in SEQUENTIAL_CHILDREN:
            return f"{SEQUENTIAL_CHILDREN[head]}.{rest}"
    return name


def _match(layout: Layout, obj: Mapping) -> Match | None:
    for container, prefix in layout.places:
        d = _container(obj, container)
        if d is None or not all(prefix + s in d for s in _SENTINELS[layout.naming]):
            continue
        tensors = {k: v for k, v in d.items() if isinstance(k, str) and torch.is_tensor(v)}
        kept, dropped = {}, []
        for key, value in tensors.items():
            name = key[len(prefix) :] if key.startswith(prefix) else None
            if name is None or name.startswith(layout.heads):
                dropped.append(key)
            elif layout.naming == "detectron2" and not _D2_RESNET.match(name):
                dropped.append(key)  # the rest of a detectron2 model (FPN, heads): not the ResNet
            else:
                kept[_rename(name, layout.naming)] = value
        return Match(layout, (container, prefix), kept, sorted(dropped))
    return None


def find_matches(obj: Mapping) -> list[Match]:
    """Every layout of :data:`LAYOUTS` that matches ``obj``, in table order."""
    return [m for layout in LAYOUTS if (m := _match(layout, obj)) is not None]


def layouts_table() -> str:
    """The Markdown table of :data:`LAYOUTS` that ``docs/checkpoints.md`` contains."""
    columns = ["layout", "releases", "recognised by (dict path: sentinel key)", "key names"]
    rows = [
        [
            f"`{lay.name}`",
            lay.releases,
            lay.recognised_by(),
            lay.source + (f". Refused: {lay.refuse}" if lay.refuse else ""),
        ]
        for lay in LAYOUTS
    ]
    return markdown_table(columns, rows)


if __name__ == "__main__":
    print(layouts_table(), end="")
