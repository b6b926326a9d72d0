#!/usr/bin/env python
"""Gather finished detectron2 runs into Markdown and CSV tables, one per protocol. The
options and the code are in transfer.cli.collect_detection_results, which setup.py also installs
as `lorac-collect-detection-results`.
"""

from transfer.cli.collect_detection_results import main

if __name__ == "__main__":
    raise SystemExit(main())
