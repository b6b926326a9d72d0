"""Command-line entry points of the pretraining side.

Each module holds one tool's argument parsing and ``main(argv=None) -> int``; setup.py installs
them as ``lorac-*`` console scripts and ``tools/*.py`` are thin wrappers that call the same
``main``. :func:`.user_errors.exit_on_user_error` gives every tool (here and in
:mod:`transfer.cli`) the same ending for a user error: one ``error:`` line, exit status 2.

May import: every other room (the top of the pretraining side): :mod:`pretrain.utils`,
:mod:`pretrain.losses`, :mod:`pretrain.config`, :mod:`pretrain.data`, :mod:`pretrain.modeling`,
:mod:`pretrain.checkpoint`, :mod:`pretrain.solver`, :mod:`pretrain.evaluation`,
:mod:`pretrain.engine`, :mod:`pretrain.cluster`.
"""
