"""Evaluation used while pretraining and after it: the one weighted-kNN implementation."""
