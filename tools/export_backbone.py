#!/usr/bin/env python
"""Export a ResNet backbone checkpoint as a torchvision or timm state dict (.pth or .safetensors).
The options and the code are in transfer.cli.export_backbone, which setup.py also installs as
`lorac-export-backbone`.
"""

from transfer.cli.export_backbone import main

if __name__ == "__main__":
    raise SystemExit(main())
