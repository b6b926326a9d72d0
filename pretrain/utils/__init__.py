"""Shared basics at the bottom of ``pretrain``: errors, tables, atomic writes, constants, run
set-up, directory locks.

May import: the standard library, torch, fvcore/detectron2 utilities. Nothing else from
``pretrain``.
"""
