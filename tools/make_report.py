#!/usr/bin/env python
"""One HTML + Markdown report of pretraining runs, evaluation tables and nuclear-norm figures.
The options and the code are in transfer.cli.make_report, which setup.py also installs as
`lorac-make-report`.
"""

from transfer.cli.make_report import main

if __name__ == "__main__":
    raise SystemExit(main())
