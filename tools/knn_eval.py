#!/usr/bin/env python
"""Weighted kNN classification of frozen features. The options and the code are
in transfer.cli.knn_eval, which setup.py also installs as `lorac-knn-eval`.
"""

from transfer.cli.knn_eval import main

if __name__ == "__main__":
    raise SystemExit(main())
