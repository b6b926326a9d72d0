"""Evaluation used while pretraining and after it: the one feature extractor and weighted kNN."""
