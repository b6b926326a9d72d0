#!/usr/bin/env python
"""Fine-tune and evaluate detectron2 models (COCO, VOC, LVIS, Cityscapes) from a converted
backbone. The options and the code are in transfer.cli.train_net, which setup.py also installs
as `lorac-train-net`.
"""

from transfer.cli.train_net import main

if __name__ == "__main__":
    raise SystemExit(main())
