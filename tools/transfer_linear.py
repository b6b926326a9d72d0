#!/usr/bin/env python
"""Linear transfer to 12 classification datasets (paper Table 2). The options and the code are
in transfer.cli.transfer_linear, which setup.py also installs as `lorac-transfer-linear`.
"""

from transfer.cli.transfer_linear import main

if __name__ == "__main__":
    raise SystemExit(main())
