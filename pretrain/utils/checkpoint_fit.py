"""A checkpoint tensor that does not fit the model is an error, never fvcore's warning.

fvcore's ``Checkpointer._load_model`` drops every tensor whose shape differs from the model's and
only logs "Skip loading parameter ... incompatible shapes": a resumed run would go on with a fresh
random queue or head in its place. :class:`StrictShapes` (mixed into a ``Checkpointer``) raises
:class:`~pretrain.utils.errors.CheckpointError` naming the file and each tensor instead, before
fvcore logs anything. A file swapped in by hand is the usual cause: the resume config check
(:mod:`pretrain.config.resume`) refuses the rest.
"""

from __future__ import annotations

from typing import Any

from pretrain.utils.errors import CheckpointError

__all__ = ["StrictShapes", "shape_mismatch_error"]


def shape_mismatch_error(path: str, incorrect: list[tuple[str, tuple, tuple]]) -> CheckpointError:
    """The error for ``incorrect`` = ``[(name, shape in the file, shape in the model)]``."""
    shown = ", ".join(f"{k} {tuple(a)} vs model {tuple(b)}" for k, a, b in incorrect[:4])
    more = f" ... ({len(incorrect)} in all)" if len(incorrect) > 4 else ""
    return CheckpointError(
        f"{path or 'checkpoint'}: tensors that do not fit the model: {shown}{more}; the file "
        "is not this run's checkpoint (or the config changed): restore it, or start afresh"
    )


class StrictShapes:
    """Mixin for an fvcore ``Checkpointer`` (put it first in the bases): loading a tensor of
    another shape than the model's raises :class:`CheckpointError`."""

    _loading_path = ""

    def load(self, path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._loading_path = path
        return super().load(path, *args, **kwargs)  # type: ignore[misc]

    def _load_model(self, checkpoint: Any) -> Any:  # fvcore's override point
        incompatible = super()._load_model(checkpoint)  # type: ignore[misc]
        if incompatible.incorrect_shapes:
            raise shape_mismatch_error(self._loading_path, incompatible.incorrect_shapes)
        return incompatible
