"""Command-line entry points of the evaluation side (and of the demo and the study, which also
evaluate).

Each module holds one tool's argument parsing and ``main(argv=None) -> int``; setup.py installs
them as ``lorac-*`` console scripts and ``tools/*.py`` are thin wrappers that call the same
``main``. User errors end every tool the same way
(:func:`pretrain.cli.user_errors.exit_on_user_error`).
"""

# before any tool module imports detectron2: pretrain.cli filters torch.jit.script's deprecation
# warning, which importing detectron2.engine (fvcore.nn) prints twice
import pretrain.cli  # noqa: F401
