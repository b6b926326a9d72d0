"""Which tool owns a run directory, so that no tool writes into (or ``--overwrite`` deletes)
another tool's run.

Every tool records itself in ``<dir>/run_owner.json`` (:data:`OWNER_FILE`, ``{"owner":
"<kind>"}``) when it creates or takes a run directory (:func:`record_owner`), and checks it
before it writes anything there (:func:`check_owner`): a directory owned by another kind of run
is refused in one line naming the owner and where to write instead, whatever ``--overwrite`` or
``--resume`` say; they apply to the tool's own runs only. A directory made before the marker
existed is recognised by its files (:func:`owner_of`): a ``config.yaml`` by its keys
(:func:`config_kind`), ``args.json`` by the tool it records, a study's lock, a report's pages.

Pretraining runs have one owner whichever tool trained them (``tools/train_pretrain.py``,
``tools/submit_pretrain.py``, the demo, a study's run): they resume each other's runs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from pretrain.utils.atomic_io import atomic_write_bytes
from pretrain.utils.errors import ConfigError, LoracError

__all__ = [
    "KINDS",
    "OWNER_FILE",
    "PRETRAINING",
    "RunKind",
    "check_owner",
    "config_kind",
    "owner_of",
    "record_owner",
]

OWNER_FILE = "run_owner.json"
PRETRAINING = "pretraining"


@dataclass(frozen=True)
class RunKind:
    """A kind of run directory: ``what`` names one (``a pretraining run``), ``tool`` writes it,
    ``configs`` are the shipped configs of that tool (empty: it takes none)."""

    what: str
    tool: str
    configs: str = ""


KINDS: Mapping[str, RunKind] = {
    PRETRAINING: RunKind("a pretraining run", "tools/train_pretrain.py", "configs/pretrain/*.yaml"),
    "linear_probe": RunKind(
        "a linear-probe run", "tools/linear_probe.py", "configs/eval/linear_*.yaml"
    ),
    "semi_supervised": RunKind(
        "a semi-supervised fine-tuning run", "tools/semi_supervised.py", "configs/eval/semi_*.yaml"
    ),
    "transfer_linear": RunKind(
        "a linear-transfer run", "tools/transfer_linear.py", "configs/eval/transfer_linear*.yaml"
    ),
    "train_net": RunKind(
        "a detection run",
        "tools/train_net.py",
        "the detection configs at the top of configs/ (coco_*, voc_*, lvis_*, cityscapes_*, "
        "ade20k_*.yaml)",
    ),
    "knn_eval": RunKind("a kNN evaluation", "tools/knn_eval.py"),
    "analyze_nuclear_norm": RunKind("a nuclear-norm analysis", "tools/analyze_nuclear_norm.py"),
    "study": RunKind("a study's folder", "tools/study.py"),
    "make_report": RunKind("a report", "tools/make_report.py"),
}


def _merged(chain: list[Mapping]) -> dict:
    """The dicts of ``chain`` (nearest first, as a ``_BASE_`` chain) merged, the nearest winning."""
    out: dict = {}
    for node in reversed(chain):
        for key, value in node.items():
            if isinstance(value, Mapping) and isinstance(out.get(key), dict):
                out[key] = _merged([value, out[key]])
            else:
                out[key] = dict(value) if isinstance(value, Mapping) else value
    return out


def config_kind(*chain: Mapping) -> str | None:
    """The kind of run (a key of :data:`KINDS`) whose config ``chain`` is (one mapping, or a
    file and its ``_BASE_`` files, nearest first), by the sections only that kind has; None when
    the keys do not tell."""
    cfg = _merged([c for c in chain if isinstance(c, Mapping)])

    def section(name: str) -> Mapping:
        value = cfg.get(name)
        return value if isinstance(value, Mapping) else {}

    model, data, solver = section("MODEL"), section("DATA"), section("SOLVER")
    if "LOSS" in cfg or "QUEUE_SIZE" in model or "HEAD_OUT_DIM" in model:
        return PRETRAINING
    if "TRANSFER" in cfg or "FEATURES" in cfg:
        return "transfer_linear"
    if {"ROI_HEADS", "RPN", "RESNETS", "BACKBONE", "WEIGHTS"} & set(model) or {
        "TRAIN", "TEST"} & set(section("DATASETS")):  # fmt: skip
        return "train_net"
    if {"SPLIT_FILE", "LABEL_PERCENT", "HELDOUT_PER_CLASS"} & set(data) or {
        "LRS", "NUM_LRS", "HEAD_LR_MULT"} & set(solver):  # fmt: skip
        return "semi_supervised"
    if data or "BATCH_SIZE" in solver:
        return "linear_probe"
    return None


def _read_json(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _config_owner(path: str) -> str | None:
    from pretrain.utils.yaml_files import read_yaml  # the one YAML reader

    try:
        loaded = read_yaml(path)
    except LoracError:
        return None
    return config_kind(loaded) if isinstance(loaded, Mapping) else None


def _args_owner(path: str) -> str | None:
    """The tool an ``args.json`` was written by (its ``argv[0]``: ``tools/knn_eval.py`` or the
    ``lorac-knn-eval`` console script)."""
    args = _read_json(path)
    argv = args.get("argv") if isinstance(args, dict) else None
    if not argv or not isinstance(argv[0], str):
        return None
    name = os.path.basename(argv[0]).removesuffix(".py").removeprefix("lorac-").replace("-", "_")
    return name if name in KINDS else None


def owner_of(path: str) -> str | None:
    """The kind of run ``path`` holds (a key of :data:`KINDS`): its marker's, else what its
    files show (module docstring); None for a folder that is no run (or not one of a tool's)."""
    if not os.path.isdir(path):
        return None
    marker = _read_json(os.path.join(path, OWNER_FILE))
    if isinstance(marker, dict) and marker.get("owner") in KINDS:
        return marker["owner"]
    config = os.path.join(path, "config.yaml")
    if os.path.isfile(config) and (kind := _config_owner(config)):
        return kind
    if os.path.isfile(os.path.join(path, "semi_results.json")):
        return "semi_supervised"
    args = os.path.join(path, "args.json")
    if os.path.isfile(args) and (kind := _args_owner(args)):
        return kind
    if os.path.isfile(os.path.join(path, ".study.lock")):
        return "study"
    if os.path.isfile(os.path.join(path, "report.html")):
        return "make_report"
    return None


def _evidence(path: str) -> str:
    names = [
        n
        for n in (
            OWNER_FILE,
            "config.yaml",
            "args.json",
            "results.json",
            "metrics.json",
            "last_checkpoint",
            "model_final.pth",
            "report.html",
        )  # fmt: skip
        if os.path.exists(os.path.join(path, n))
    ]
    return ", ".join(names[:4])


def check_owner(
    path: str, owner: str, what: str = "OUTPUT_DIR", error: type[LoracError] = ConfigError
) -> None:
    """Raise ``error`` when ``path`` holds a run of another kind than ``owner``: one line naming
    its owner and a folder to write to instead. Reads only."""
    found = owner_of(path)
    if found is None or found == owner:
        return
    kind = KINDS[found]
    instead = os.path.join(path, owner)
    raise error(
        f"{what} {path} holds {kind.what} ({kind.tool}; {_evidence(path)}): "
        f"{KINDS[owner].tool} writes only into its own runs, with or without --overwrite, and "
        f"leaves this one as it is; choose another {what}, e.g. {instead}"
    )


def record_owner(path: str, owner: str) -> None:
    """Mark ``path`` (created if needed) as ``owner``'s run directory; main process only."""
    marker = os.path.join(path, OWNER_FILE)
    current = _read_json(marker)
    if isinstance(current, dict) and current.get("owner") == owner:
        return
    os.makedirs(path, exist_ok=True)
    atomic_write_bytes(marker, (json.dumps({"owner": owner}) + "\n").encode())
