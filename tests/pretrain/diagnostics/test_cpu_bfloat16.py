"""The CPU bfloat16 conv fault counter (:mod:`pretrain.diagnostics.cpu_bfloat16`)."""

from __future__ import annotations

from pretrain.diagnostics.cpu_bfloat16 import padding_tap_faults


def test_the_fault_counter_sees_no_fault_in_float32():
    """The fault counter is not always firing: float32's gradient is exact."""
    assert padding_tap_faults(None, channels_last=True, trials=3) == (0, 0)
