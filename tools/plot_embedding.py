#!/usr/bin/env python
"""A 2-D t-SNE of a pretraining run's kNN features beside random init. The options and the code
are in transfer.cli.plot_embedding, which setup.py also installs as `lorac-plot-embedding`.
"""

from transfer.cli.plot_embedding import main

if __name__ == "__main__":
    raise SystemExit(main())
