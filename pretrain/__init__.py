"""LORAC pretraining: produces checkpoints; never imports :mod:`transfer`.

Rooms, bottom to top (docs/layout.md draws the tree). A room imports only rooms listed before it
here, those its own docstring names on its "May import" line (``tests/test_layers.py`` checks
both):

* ``utils``: errors, atomic writes, constants, run set-up, torch.distributed set-up from the
  launcher's variables, the stop signals and shielded data workers.
* ``losses``: the method: the LORAC loss object and functions, the priors, the nuclear norm.
* ``config``: defaults, validation, strict YAML loading.
* ``data``: sources, samplers, crops and colour augmentation.
* ``modeling``: encoders and the multi-view MoCo model that holds the loss.
* ``solver``: LARS and learning-rate schedules.
* ``evaluation``: feature extraction and weighted kNN, also as a training monitor.
* ``engine``: the trainer on detectron2's engine, hooks (stopping on a signal included),
  checkpointing, launch.
* ``diagnostics``: instruments that measure the step, for benchmarks and tests.
* ``cluster``: SLURM jobs through submitit.
* ``cli``: the command-line tools' ``main`` functions.
"""
