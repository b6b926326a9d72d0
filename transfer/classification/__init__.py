"""Classification evaluation of pretrained backbones: kNN, linear probes, 12-dataset linear
transfer and semi-supervised fine-tuning (docs/evaluation.md).
"""
