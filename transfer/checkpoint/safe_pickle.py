"""Reading weights pickles (detectron2 ``.pkl``) without running code from them.

Unpickling runs whatever callables the file names. :func:`load_safe_pickle` resolves only the few
globals a weights file needs (numpy's array and scalar reconstruction, ``numpy.dtype``,
``OrderedDict``, and ``_codecs.encode``, which protocol-2 pickles use for bytes) and refuses
anything else, naming the file and the global, before anything runs. It is the project's one
restricted unpickler: the checkpoint reader (:mod:`transfer.checkpoint.reader`) and the detection
weights check (:mod:`transfer.detection.weights`) both call it.
"""

from __future__ import annotations

import importlib
import pickle
from typing import Any, BinaryIO

import numpy as np

from pretrain.utils.errors import UnsafePickleError  # noqa: F401 (re-exported)

__all__ = ["SAFE_PICKLE_GLOBALS", "UnsafePickleError", "load_safe_pickle"]


# Everything a detectron2 weights pickle (model zoo, tools/convert_to_d2.py, Python 2 era files)
# needs beyond dicts, lists, tuples, strings and numbers. numpy 2 moved numpy.core to numpy._core.
SAFE_PICKLE_GLOBALS = frozenset(
    [
        *((core, name) for core in ("numpy.core.multiarray", "numpy._core.multiarray")
          for name in ("_reconstruct", "scalar")),
        *((core, "_frombuffer") for core in ("numpy.core.numeric", "numpy._core.numeric")),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("collections", "OrderedDict"),
        ("_codecs", "encode"),
    ]
)  # fmt: skip


class _WeightsUnpickler(pickle.Unpickler):
    def __init__(self, file: BinaryIO, path: str) -> None:
        super().__init__(file, encoding="latin1")  # Python 2 pickles hold numpy data as str
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in SAFE_PICKLE_GLOBALS:
            raise UnsafePickleError(
                f"{self.path}: refusing to unpickle {module}.{name}: a weights .pkl may only "
                "hold dicts, lists, tuples, strings, numbers and numpy arrays"
            )
        # files written under numpy 1 name numpy.core, under numpy 2 numpy._core: read both
        numpy2 = int(np.__version__.split(".")[0]) >= 2
        old, new = ("numpy.core.", "numpy._core.") if numpy2 else ("numpy._core.", "numpy.core.")
        if module.startswith(old):
            module = new + module[len(old) :]
        return getattr(importlib.import_module(module), name)


def load_safe_pickle(path: str) -> Any:
    """The object pickled in ``path``, built from safe globals only.

    Raises:
        UnsafePickleError: the file names another global (naming the file and the global).
        OSError, EOFError, pickle.UnpicklingError, ...: a missing, truncated or corrupt file;
            callers turn these into their own one-line errors.
    """
    with open(path, "rb") as f:
        return _WeightsUnpickler(f, path).load()
