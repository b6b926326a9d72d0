#!/usr/bin/env python
"""Convert a ResNet-50 (or 18/34/101/152) backbone checkpoint into a detectron2 weights file.
The options and the code are in transfer.cli.convert_to_d2, which setup.py also installs as
`lorac-convert-to-d2`.
"""

from transfer.cli.convert_to_d2 import main

if __name__ == "__main__":
    raise SystemExit(main())
