#!/usr/bin/env python
"""Semi-supervised fine-tuning on 1% / 10% of ImageNet labels (paper Table 3). The options and
the code are in transfer.cli.semi_supervised, which setup.py also installs as `lorac-semi-
supervised`.
"""

from transfer.cli.semi_supervised import main

if __name__ == "__main__":
    raise SystemExit(main())
