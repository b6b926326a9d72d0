#!/usr/bin/env python
"""Submit LORAC pretraining (or an evaluation tool) to SLURM through submitit. The options and
the code are in pretrain.cli.submit_pretrain, which setup.py also installs as `lorac-submit-
pretrain`.
"""

from pretrain.cli.submit_pretrain import main

if __name__ == "__main__":
    raise SystemExit(main())
