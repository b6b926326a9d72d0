"""The one way the project reads a YAML file: every config (pretraining, classification,
detection, the study's), a run's saved ``config.yaml`` on resume, and the files the run-directory
guard and the reports look into.

:func:`read_yaml` turns each way a file can be wrong into one :class:`ConfigError` line naming
it: not there, binary (a checkpoint passed as a config is named as one), not UTF-8 (with the byte,
its line and column, and a hint when it reads as Latin-1), or a YAML syntax error (``file:line:
column``, a tab where YAML allows none included). PyYAML's own errors are multi-line and name no
fix; its ``safe_load`` of undecodable bytes is a ``UnicodeDecodeError`` traceback.
"""

from __future__ import annotations

import os

import yaml

from pretrain.utils.errors import ConfigError, LoracError

__all__ = ["CHECKPOINT_SUFFIXES", "read_yaml", "read_yaml_text", "yaml_error_line"]

# Files a user may pass as a config by mistake: the checkpoints of docs/checkpoints.md.
CHECKPOINT_SUFFIXES = (".pth", ".pt", ".pkl", ".pth.tar", ".ckpt", ".safetensors", ".bin")
# How checkpoints start: a zip archive (torch.save), a pickle (protocol 2+), safetensors' length.
_ZIP, _PICKLE = b"PK\x03\x04", b"\x80"


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def yaml_error_line(path: str, e: yaml.YAMLError) -> str:
    """``file:line:column: invalid YAML: problem (context)`` of a PyYAML error (1-based), naming
    the file whose text failed; a tab gets the fix spelled out."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is None:
        return f"{path}: invalid YAML ({_one_line(e)})"
    name = mark.name if os.path.isfile(str(mark.name)) else path
    what = _one_line(getattr(e, "problem", "") or "invalid YAML")
    context, at = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and at is not None and at is not mark:
        what += f" ({_one_line(context)} at line {at.line + 1}, column {at.column + 1})"
    if "'\\t'" in what:
        what += "; YAML indents with spaces only: replace the tab by spaces"
    return f"{name}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {what}"


def _looks_like_checkpoint(path: str, data: bytes) -> bool:
    return path.lower().endswith(CHECKPOINT_SUFFIXES) or data.startswith((_ZIP, _PICKLE))


def _decoded(path: str, data: bytes, what: str) -> str:
    """``data`` as UTF-8 text, or the one-line error saying why it is not a YAML file."""
    if b"\x00" in data[:8192] or _looks_like_checkpoint(path, data[:8]):
        if _looks_like_checkpoint(path, data[:8]):
            hint = (
                "it looks like a checkpoint: give a YAML config here (checkpoints go to "
                "--checkpoint or MODEL.WEIGHTS)"
            )
        else:
            hint = "it is binary data"
        raise ConfigError(f"{path} is not a YAML {what}: {hint}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        byte = data[e.start]
        latin = (
            f" (as Latin-1 it reads {bytes([byte]).decode('latin-1')!r})" if byte >= 0xA0 else ""
        )
        raise ConfigError(
            f"{path}:{line}:{column}: not UTF-8 text: byte 0x{byte:02x}{latin}; save the file "
            "as UTF-8"
        ) from None


def read_yaml_text(path: str, what: str = "config") -> str:
    """The text of the YAML file ``path`` (``what`` names it in messages), checked to be
    UTF-8 text and not a binary file; :class:`ConfigError` otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory, not a YAML {what} file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror})") from None
    return _decoded(path, data, what)


def read_yaml(path: str, what: str = "config", error: type[LoracError] = ConfigError) -> object:
    """The YAML document of ``path`` (``None`` for an empty file); ``error`` (one line naming
    the file, and the line and column of a syntax error) when it cannot be read as YAML."""
    try:
        text = read_yaml_text(path, what)
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(yaml_error_line(path, e)) from None
    except ConfigError as e:
        if error is ConfigError:
            raise
        raise error(str(e)) from None
