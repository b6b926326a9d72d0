"""Shared basics at the bottom of ``pretrain``: errors, atomic writes, constants, run set-up,
the one YAML reader (``yaml_files``), output paths and which tool owns a run directory
(``output_dir``, ``run_owner``), directory locks, pixels and devices, joining torch.distributed
from the launcher's variables (``distributed``), the stop signals, SLURM requeue and shielded data
workers (``signals``), the one compile guard (``compiled``).

May import: nothing else from ``pretrain`` (the standard library, torch, fvcore/detectron2
utilities only).
"""
