"""Command-line entry points of the evaluation side, the demo and the study: one tool's argument
parsing and ``main(argv=None) -> int`` per module, installed as ``lorac-*`` console scripts and
called by the thin ``tools/*.py``.
"""

# before any tool module imports detectron2: pretrain.cli filters torch.jit.script's deprecation
# warning, which importing detectron2.engine (fvcore.nn) prints twice
import pretrain.cli  # noqa: F401
