#!/usr/bin/env python
"""VOC07 linear SVMs (and low-shot) on frozen features. The options and the code are in
transfer.cli.svm_voc07, which setup.py also installs as `lorac-svm-voc07`.
"""

from transfer.cli.svm_voc07 import main

if __name__ == "__main__":
    raise SystemExit(main())
