"""Whether a file that ``torch.save`` wrote is complete, read from its ends only (no tensor loaded).

``torch.save`` writes a zip archive whose directory is its last bytes. A save or copy cut off (a
full disk, a quota, a killed ``rsync``) leaves a file without it, which ``torch.load`` reports
as ``PytorchStreamReader failed reading zip archive: failed finding central directory`` at the
end of a long traceback. :func:`incomplete_torch_file` says so in words, in milliseconds
whatever the file's size, so that a tool can refuse it before it writes anything.
"""

from __future__ import annotations

import os
import zipfile

__all__ = ["incomplete_torch_file"]

_ZIP_MAGIC = b"PK\x03\x04"


def incomplete_torch_file(path: str) -> str | None:
    """Why the file ``path`` is an incomplete ``torch.save`` file (``"empty"``, ``"truncated
    (N bytes, ...)"``), or None: complete, or not in torch's zip format (a legacy or pickle
    file, judged by whatever reads it)."""
    size = os.path.getsize(path)
    if size == 0:
        return "empty (0 bytes)"
    with open(path, "rb") as f:
        if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
            return None
    try:
        zipfile.ZipFile(path).close()  # reads the directory at the file's end, no member
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return f"truncated ({size} bytes, without the zip directory torch.save writes last)"
    return None
