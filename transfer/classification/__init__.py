"""Classification evaluation of pretrained backbones: kNN, linear probes, transfer, semi-supervised."""
