"""The one strict config loader: defaults, a YAML file (``_BASE_`` aware) and ``KEY VALUE`` opts.

Every config of the project (pretraining, classification, detection, the study's) goes through
:func:`load_strict`, which reads the file and its ``_BASE_`` files with the one YAML reader first
(:func:`read_config_chain`: encodings, binary files, syntax, loops of bases) and refuses a config
of another kind of run (a pretraining config given to the detection trainer) before fvcore or
detectron2 merge it. The strictness is fvcore/yacs's; this module turns yacs's bare errors into
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
from pretrain.utils.run_owner import KINDS, config_kind
from pretrain.utils.yaml_files import read_yaml, yaml_error_line

__all__ = ["check_override_pairs", "load_strict", "read_config_chain"]

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


def _resolve_base(file: str, base: str) -> str:
    """Where fvcore looks for ``file``'s ``_BASE_`` (relative to ``file``'s folder)."""
    base = os.path.expanduser(base)
    return base if os.path.isabs(base) else os.path.join(os.path.dirname(file), base)


def read_config_chain(path: str) -> list[tuple[str, dict]]:
    """``path`` and its ``_BASE_`` files, nearest first, each ``(file, its YAML mapping)``, read
    by the one YAML reader (:func:`pretrain.utils.yaml_files.read_yaml`: binary files, other
    encodings and syntax errors are one line each). :class:`ConfigError` for a file that is no
    mapping, a missing base, or bases that loop (fvcore would recurse until ``RecursionError``).
    """
    chain: list[tuple[str, dict]] = []
    seen: list[str] = []
    current = path
    while True:
        data = read_yaml(current)
        if not isinstance(data, dict):
            raise ConfigError(f"{current}: expected a YAML mapping of config keys")
        chain.append((current, data))
        seen.append(os.path.realpath(current))
        base = data.get("_BASE_")
        if base is None or (isinstance(base, str) and base.startswith(("http://", "https://"))):
            return chain
        if not isinstance(base, str) or not base:
            raise ConfigError(f"{current}: _BASE_ {base!r}: expected the path of a config file")
        resolved = _resolve_base(current, base)
        if not os.path.isfile(resolved):
            raise ConfigError(f"{current}: _BASE_ {base!r}: no such config file ({resolved})")
        if os.path.realpath(resolved) in seen:
            loop = " -> ".join([*(file for file, _ in chain), resolved])
            raise ConfigError(
                f"{current}: _BASE_ {base!r} makes a loop of bases ({loop}); a config may "
                "not be its own base: remove the _BASE_ that points back"
            )
        current = resolved


def _check_kind(defaults: CfgNode, chain: list[tuple[str, dict]]) -> None:
    """Refuse, before anything merges it, a config of another kind of run than ``defaults``
    (a pretraining config given to the detection trainer): one line naming what the file is,
    the tool it is for, and the configs this tool takes. Only when the file has a section the
    defaults lack, so that a config merging cleanly is never refused."""
    path = chain[0][0]
    datas = [data for _, data in chain]
    found, expected = config_kind(*datas), config_kind(defaults)
    if found is None or expected is None or found == expected:
        return
    foreign = {k for data in datas for k in data if k != "_BASE_" and k not in defaults}
    for data in datas:
        for name, section in data.items():
            if isinstance(section, dict) and isinstance(defaults.get(name), CfgNode):
                foreign |= {f"{name}.{k}" for k in section if k not in defaults[name]}
    if not foreign:
        return
    have, want = KINDS[found], KINDS[expected]
    takes = f"{want.tool} takes {want.configs or 'its own configs'}"
    raise ConfigError(
        f"{path} is a config of {have.what} ({have.tool}), not of {want.what}: {takes}"
    )


def _where(chain: list[tuple[str, dict]], full_key: str) -> tuple[str, object]:
    """The file of the ``_BASE_`` chain that sets ``full_key`` and its value there
    (the first file and no value if none does)."""
    for file, node in chain:
        for part in full_key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING:
            return file, node
    return chain[0][0], _MISSING


def check_override_pairs(opts: Sequence[str]) -> None:
    """Raise :class:`ConfigError` unless ``opts`` are ``KEY VALUE`` pairs."""
    if len(opts) % 2:
        raise ConfigError(f"overrides must be KEY VALUE pairs, got {list(opts)}")


def load_strict(defaults: CfgNode, path: str = "", opts: Sequence[str] = ()) -> CfgNode:
    """A clone of ``defaults`` (any fvcore ``CfgNode``) merged with the YAML file ``path`` (none
    if empty) and ``opts``, neither validated beyond key names and types nor frozen. Raises
    :class:`ConfigError` naming the file (or the command line), key and value.
    """
    cfg = defaults.clone()
    if path:
        chain = read_config_chain(path)  # every file of the chain readable, once
        _check_kind(defaults, chain)
        try:
            with _ints_as_floats():
                cfg.merge_from_file(path)
        except yaml.YAMLError as e:  # read_config_chain parsed the same text: not expected
            raise ConfigError(yaml_error_line(path, e)) from None
        except (KeyError, ValueError, AssertionError, OSError) as e:
            msg = _one_line(e)
            m = _KEY_IN_MESSAGE.search(msg)
            where, value = _where(chain, m.group(1)) if m else (path, _MISSING)
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
