"""The one strict config loader: defaults, a YAML file (``_BASE_`` aware) and ``KEY VALUE`` opts.

Every config of the project (pretraining, classification, detection) goes through
:func:`load_strict`. The strictness is fvcore/yacs's; this module turns yacs's bare errors into
one :class:`~pretrain.utils.errors.ConfigError` line naming the file that sets the key (along the
``_BASE_`` chain), the key, its value and the closest known key. One relaxation, as detectron2
users expect: an integer where the default is a float (``SOLVER.BASE_LR 1``) is taken as a float.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
from collections.abc import Iterator, Sequence

import yacs.config
import yaml
from fvcore.common.config import CfgNode

from pretrain.utils.errors import ConfigError

__all__ = ["check_override_pairs", "load_strict"]

# yacs/detectron2 messages end with the full key: "Non-existent config key: A.B",
# "Non-existent key: A.B" (opts), "Type mismatch (...) for config key: A.B".
_KEY_IN_MESSAGE = re.compile(r"(?:config key|key|Key):? ([A-Za-z0-9_.]+)")
_UNKNOWN_KEY = re.compile(r"^Non-existent (?:config )?key: ([A-Za-z0-9_.]+)")
_MISSING = object()


def _dotted_keys(node: CfgNode, prefix: str = "") -> list[str]:
    """Every key of ``node`` as a full dotted name, sections too (``SOLVER``, ``SOLVER.BASE_LR``):
    yacs names a whole unknown section of a file (``SOLVR``) by itself."""
    keys = []
    for name, value in node.items():
        keys.append(f"{prefix}{name}")
        if isinstance(value, CfgNode):
            keys += _dotted_keys(value, f"{prefix}{name}.")
    return keys


def _unknown_key(msg: str, cfg: CfgNode) -> str:
    """yacs's ``Non-existent config key: A.B ...`` as ``unknown config key A.B ...`` with the
    closest dotted key of ``cfg`` (ignoring case: a misspelt section is found too)."""
    m = _UNKNOWN_KEY.match(msg)
    if not m:
        return msg
    key = m.group(1)
    msg = f"unknown config key {key}{msg[m.end() :]}"
    known = {k.upper(): k for k in _dotted_keys(cfg)}
    close = difflib.get_close_matches(key.upper(), known, n=1, cutoff=0.8)
    return msg + (f"; did you mean {known[close[0]]}?" if close else "")


def _yaml_float_hint(value: object) -> str:
    """The YAML spelling (``.inf``, ``.nan``) of a string meant as an infinite or NaN number."""
    if not isinstance(value, str):
        return ""
    word = value.strip().lower()
    sign = "-" if word.startswith("-") else ""
    spelt = {"inf": ".inf", "infinity": ".inf", "nan": ".nan"}.get(word.lstrip("+-"))
    if spelt is None:
        return ""
    return f"; YAML spells {'NaN' if spelt == '.nan' else 'infinity'} {sign}{spelt}, not {value}"


def _one_line(e: BaseException) -> str:
    text = str(e.args[0]) if e.args else type(e).__name__
    return " ".join(text.split())


def _yaml_syntax(path: str, e: yaml.YAMLError) -> str:
    """``file:line:column: problem (context)`` of a YAML syntax error (1-based), naming the file
    whose text failed (maybe a ``_BASE_`` file)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is None:
        return f"{path}: invalid YAML ({_one_line(e)})"
    name = mark.name if os.path.isfile(str(mark.name)) else path
    what = " ".join(str(getattr(e, "problem", "") or "invalid YAML").split())
    context, at = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and at is not None and at is not mark:
        what += f" ({' '.join(context.split())} at line {at.line + 1}, column {at.column + 1})"
    return f"{name}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {what}"


_yacs_check_type = yacs.config._check_and_coerce_cfg_value_type


def _int_to_float_too(replacement: object, original: object, key: str, full_key: str) -> object:
    if type(replacement) is int and type(original) is float:  # not bool (type(True) is bool)
        return float(replacement)
    return _yacs_check_type(replacement, original, key, full_key)


@contextlib.contextmanager
def _ints_as_floats() -> Iterator[None]:
    """While merging, take ``1`` for a float key as ``1.0``; yacs has no hook for its type
    check, so its module-level checker is wrapped for the duration of a merge."""
    yacs.config._check_and_coerce_cfg_value_type = _int_to_float_too
    try:
        yield
    finally:
        yacs.config._check_and_coerce_cfg_value_type = _yacs_check_type


def _read_base(file: str) -> str | None:
    """The ``_BASE_`` that ``file`` names (None: none, or unreadable YAML)."""
    try:
        with open(file) as f:
            data = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return None
    base = data.get("_BASE_") if isinstance(data, dict) else None
    return base if isinstance(base, str) else None


def _resolve_base(file: str, base: str) -> str:
    """Where fvcore looks for ``file``'s ``_BASE_`` (relative to ``file``'s folder)."""
    base = os.path.expanduser(base)
    return base if os.path.isabs(base) else os.path.join(os.path.dirname(file), base)


def _base_chain(path: str) -> list[str]:
    """``path`` followed by its ``_BASE_`` files, nearest first (unreadable ones skipped)."""
    chain, current = [], path
    while current and os.path.isfile(current) and current not in chain:
        chain.append(current)
        base = _read_base(current)
        if base is None:
            break
        current = _resolve_base(current, base)
    return chain


def _missing_base(path: str) -> str | None:
    """The error naming the file of ``path``'s ``_BASE_`` chain whose base is missing, or None
    (fvcore's own error is a bare ``FileNotFoundError``)."""
    last = _base_chain(path)[-1]
    base = _read_base(last)
    if base is None or base.startswith(("http://", "https://")):
        return None
    resolved = _resolve_base(last, base)
    if os.path.isfile(resolved):
        return None  # a loop of bases; fvcore reports it
    return f"{last}: _BASE_ {base!r}: no such config file ({resolved})"


def check_override_pairs(opts: Sequence[str]) -> None:
    """Raise :class:`ConfigError` unless ``opts`` are ``KEY VALUE`` pairs."""
    if len(opts) % 2:
        raise ConfigError(f"overrides must be KEY VALUE pairs, got {list(opts)}")


def _not_a_mapping(path: str) -> str | None:
    """The first file of the ``_BASE_`` chain whose YAML is not a mapping (e.g. empty)."""
    for file in _base_chain(path):
        try:
            with open(file) as f:
                if not isinstance(yaml.safe_load(f), dict):
                    return file
        except (OSError, yaml.YAMLError):
            return file
    return None


def _where(path: str, full_key: str) -> tuple[str, object]:
    """The file of the ``_BASE_`` chain that sets ``full_key`` and its value there
    (``path`` and no value if none does)."""
    for file in _base_chain(path):
        try:
            with open(file) as f:
                node = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError):
            continue
        for part in full_key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING:
            return file, node
    return path, _MISSING


def load_strict(defaults: CfgNode, path: str = "", opts: Sequence[str] = ()) -> CfgNode:
    """A clone of ``defaults`` (any fvcore ``CfgNode``) merged with the YAML file ``path`` (none
    if empty) and ``opts``, neither validated beyond key names and types nor frozen. Raises
    :class:`ConfigError` naming the file (or the command line), key and value.
    """
    cfg = defaults.clone()
    if path:
        if not os.path.isfile(path):
            raise ConfigError(f"{path}: no such config file")
        missing = _missing_base(path)
        if missing:
            raise ConfigError(missing)
        try:
            with _ints_as_floats():
                cfg.merge_from_file(path)
        except yaml.YAMLError as e:
            raise ConfigError(_yaml_syntax(path, e)) from None
        except (TypeError, AttributeError):
            # fvcore indexes the loaded YAML: an empty file or a list fails inside it
            bad = _not_a_mapping(path)
            if bad is None:
                raise
            raise ConfigError(f"{bad}: expected a YAML mapping of config keys") from None
        except (KeyError, ValueError, AssertionError, OSError) as e:
            msg = _one_line(e)
            m = _KEY_IN_MESSAGE.search(msg)
            where, value = _where(path, m.group(1)) if m else (path, _MISSING)
            if value is not _MISSING and "Type mismatch" not in msg:  # that one shows the value
                msg += f" (value {value!r})"
            raise ConfigError(
                f"{where}: {_unknown_key(msg, cfg)}{_yaml_float_hint(value)}"
            ) from None
    if opts:
        check_override_pairs(opts)
        try:
            with _ints_as_floats():
                cfg.merge_from_list(list(opts))
        except (KeyError, ValueError, AssertionError, TypeError) as e:
            msg = _one_line(e)
            m = _KEY_IN_MESSAGE.search(msg)
            given = dict(zip(opts[::2], opts[1::2], strict=True))
            if m and m.group(1) in given and "Type mismatch" not in msg:
                msg += f" (value {given[m.group(1)]!r})"
            raise ConfigError(f"command-line override: {_unknown_key(msg, cfg)}") from None
    return cfg
