"""The project's one error hierarchy (the bottom layer: imports nothing from the project).

Every error a user can cause (a bad config value, file, dataset, checkpoint or request) is a
:class:`LoracError` whose message names the file, key or value; the command-line tools catch it,
print one ``error: <message>`` line and exit with :data:`USER_ERROR_EXIT_CODE`. Anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import pickle

USER_ERROR_EXIT_CODE = 2


class LoracError(ValueError):
    """Base of every user error; the message is one line naming the file, key or value."""


class ConfigError(LoracError):
    """An invalid config file, key or value; the message names the file, the key and the value."""


class DatasetError(LoracError):
    """A dataset that cannot be used; the message names the path."""


class CheckpointError(LoracError):
    """A checkpoint that cannot give a ResNet backbone; the message names the file and keys."""


class ResultsError(LoracError):
    """A results file or run directory that cannot be read; the message names it."""


class UnsafePickleError(LoracError, pickle.UnpicklingError):
    """A pickle that names a global outside the allow-list (nothing was run)."""


class BusyError(LoracError):
    """A directory another live process is using (a run, a study); the message names the
    directory and the holder."""
