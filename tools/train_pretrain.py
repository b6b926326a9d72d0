#!/usr/bin/env python
"""Pretrain LORAC / MoCo-M / MoCo-v2 (one process per GPU, or CPU processes with gloo). The
options and the code are in pretrain.cli.train_pretrain, which setup.py also installs as `lorac-
train-pretrain`.
"""

from pretrain.cli.train_pretrain import main

if __name__ == "__main__":
    raise SystemExit(main())
