"""The floor every tool stands on (here and in :mod:`transfer.cli`), and the pretraining tools.

The floor: :mod:`.arguments` (:class:`~.arguments.ToolParser`, whose bad command line is one
``error:`` line and exit status 2, the number types, ``--device``), :mod:`.overrides` (options
after the trailing ``KEY VALUE`` overrides), :mod:`.launching` (the tools that run under
detectron2's ``launch``), :mod:`.quiet` (library output hidden unless ``--verbose``) and
:mod:`.user_errors` (a user error as one ``error:`` line and status 2, a Ctrl-C as one
``interrupted:`` line and status 130, and :func:`~.user_errors.tool_main`, the ``main`` of a tool
that parses, then runs). The tools: ``train_pretrain`` and ``submit_pretrain``, each one
``main(argv=None) -> int`` that setup.py installs as a ``lorac-*`` console script and that
``tools/*.py`` call.

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
