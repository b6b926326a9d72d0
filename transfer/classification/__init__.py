"""Classification evaluation of pretrained backbones.

kNN, linear probes, 12-dataset linear transfer and semi-supervised fine-tuning; the tools in
``tools/`` are thin command-line wrappers around this package (see docs/evaluation.md).
"""
