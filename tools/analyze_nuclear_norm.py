#!/usr/bin/env python
"""Nuclear norm of 32 augmented views per test image, per pretrained model (paper Fig. 3b-c,
4c). The options and the code are in transfer.cli.analyze_nuclear_norm, which setup.py also
installs as `lorac-analyze-nuclear-norm`.
"""

from transfer.cli.analyze_nuclear_norm import main

if __name__ == "__main__":
    raise SystemExit(main())
