"""Command-line entry points of the pretraining side.

Each module holds one tool's argument parsing and ``main(argv=None) -> int``; setup.py installs
them as ``lorac-*`` console scripts and ``tools/*.py`` are thin wrappers that call the same
``main``. :func:`.user_errors.exit_on_user_error` gives every tool (here and in
:mod:`transfer.cli`) the same ending for a user error: one ``error:`` line, exit status 2;
:class:`.arguments.ToolParser` the same ending for a bad command line.

May import: every other room (the top of the pretraining side): :mod:`pretrain.utils`,
:mod:`pretrain.losses`, :mod:`pretrain.config`, :mod:`pretrain.data`, :mod:`pretrain.modeling`,
:mod:`pretrain.solver`, :mod:`pretrain.evaluation`, :mod:`pretrain.engine`, :mod:`pretrain.cluster`.
"""

import warnings

# fvcore.nn (imported by detectron2.engine, which every tool imports) compiles its focal losses
# with torch.jit.script at import time, and torch 2.14 warns that torch.jit.script is deprecated,
# twice, in every tool's output. Neither this project nor its users can act on it; the filter is
# for exactly that warning from torch.jit and is installed here because every tool's main module
# imports this package (pretrain.cli.user_errors) before detectron2. pyproject.toml's pytest
# filter is the same one, for the tests.
warnings.filterwarnings(
    "ignore",
    message=r"`torch\.jit\.script` is deprecated",
    category=FutureWarning,
    module=r"torch\.jit\._script",
)
