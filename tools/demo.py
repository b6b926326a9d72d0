#!/usr/bin/env python
"""`make demo`: pretrain LORAC on Fashion-MNIST (ResNet-18, CPU, a few minutes), report the kNN
top-1 of the learned features beside raw pixels and a randomly initialised network, and convert
the backbone to detectron2 when its stem allows (see docs/demo.md). The options and the code are
in transfer.cli.demo, which setup.py also installs as `lorac-demo`.
"""

from transfer.cli.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
