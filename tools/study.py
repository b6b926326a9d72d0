#!/usr/bin/env python
"""`make study`: pretrain LORAC, MoCo-M and MoCo-v2 at demo scale with several seeds, evaluate
each checkpoint (kNN, linear probe, test nuclear norm) and write a results page with a plot. The
options and the code are in transfer.cli.study, which setup.py also installs as `lorac-study`.
"""

from transfer.cli.study import main

if __name__ == "__main__":
    raise SystemExit(main())
