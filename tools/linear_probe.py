#!/usr/bin/env python
"""Linear classification on frozen features (paper Table 1, ImageNet-100 ablations). The options
and the code are in transfer.cli.linear_probe, which setup.py also installs as `lorac-linear-
probe`.
"""

from transfer.cli.linear_probe import main

if __name__ == "__main__":
    raise SystemExit(main())
