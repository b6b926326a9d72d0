"""The memory estimate counts what autograd saves, each storage once, and grows with the batch."""

from __future__ import annotations

import torch

from pretrain.config.defaults import load_config
from pretrain.engine.memory import estimate_memory, saved_bytes
from transfer.classification.demo import DEMO_CONFIG


def test_saved_bytes_counts_each_saved_storage_once():
    x = torch.randn(1000, requires_grad=True)  # 4000 bytes
    _, n = saved_bytes(lambda a: (a * a).sum(), x)  # mul saves x twice: one storage
    assert n == 4000
    _, n = saved_bytes(lambda a: a.sum(), x)  # sum saves nothing
    assert n == 0
    with torch.no_grad():
        _, n = saved_bytes(lambda a: (a * a).sum(), x)
    assert n == 0


def test_the_estimate_of_a_tiny_step_is_per_image_and_counts_the_state():
    opts = ["DATASETS.ROOT", "x", "MODEL.HEAD_HIDDEN_DIM", "16", "MODEL.HEAD_OUT_DIM", "8",
            "INPUT.LARGE_SIZE", "32", "INPUT.SMALL_SIZE", "16", "SOLVER.AMP.ENABLED", "False",
            "MODEL.CHANNELS_LAST", "False"]  # fmt: skip
    cfg = load_config(DEMO_CONFIG, opts)
    est = estimate_memory(cfg)
    assert est.activation_bytes_per_image > 0
    # the loss reads a copy of the queue (QUEUE_SIZE x HEAD_OUT_DIM float32 per key crop) at any
    # batch: the fixed part of the step
    queue = cfg.MODEL.QUEUE_SIZE * cfg.MODEL.HEAD_OUT_DIM * 4 * cfg.INPUT.KEY_CROPS
    assert queue <= est.step_bytes < queue + 4 * est.activation_bytes_per_image
    # ResNet-18's 11.2 M float32 parameters, 4 times: both encoders, the gradient, the momentum
    assert est.state_bytes > 4 * 11_000_000 * 4
    per = est.activation_bytes_per_image
    assert est.per_process(10) == est.state_bytes + est.step_bytes + 10 * per
