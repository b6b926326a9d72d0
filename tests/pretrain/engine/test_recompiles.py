"""Every recompile told in one line with its cause (pretrain/engine/recompiles.py), on the torch
installed: a compiled function recompiled by a changed attribute it reads."""

from __future__ import annotations

import logging

import torch

from pretrain.engine.recompiles import RecompileWatch, compiled_graphs, recompile_cause


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def test_a_recompile_is_told_in_one_line_naming_the_guard_and_its_source_line():
    torch.compiler.reset()
    module = _Scaled()
    step = torch.compile(module, backend="eager", dynamic=False)
    told: list[str] = []
    with RecompileWatch(told.append) as watch:
        step(torch.ones(2))
        step(torch.ones(2))  # the same guards: nothing to tell
        assert told == [] and watch.supported
        module.scale = 3.0  # a float the graph read: its guard fails
        graphs = compiled_graphs()
        step(torch.ones(2))
    assert compiled_graphs() == graphs + 1
    assert len(told) == 1 and "\n" not in told[0], told
    assert told[0].startswith("forward (test_recompiles.py:") and "scale" in told[0], told
    assert "return x * self.scale" in told[0], told
    # leaving the watch restores torch's logging: a later recompile goes unreported here
    module.scale = 4.0
    step(torch.ones(2))
    assert len(told) == 1
    assert logging.getLogger("torch._dynamo.guards.__recompiles").handlers == []


def test_the_cause_of_torchs_message_in_one_line():
    message = (
        "Recompiling function forward in /a/pretrain/modeling/meta_arch.py:244\n"
        "    triggered by the following guard failure(s):\n"
        "    - 0/0: self._modules['criterion']._beta == inf      # prior_on = ...  # lorac.py:330\n"
        "    - User stack trace:\n"
        '    -   File "/a/pretrain/modeling/meta_arch.py", line 274, in forward\n'
        "    - 0/1: ___check_obj_id(x, 1)"
    )
    assert recompile_cause(message) == (
        "forward (meta_arch.py:244): 0/0: self._modules['criterion']._beta == inf # prior_on = "
        "... # lorac.py:330 (+1 more)"
    )
