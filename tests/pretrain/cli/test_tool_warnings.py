"""No tool prints torch's ``torch.jit.script is deprecated`` warning: importing
detectron2.engine (fvcore.nn's focal losses) raises it twice in every tool, and neither this
project nor its users can act on it. Both families of entry points are checked:
``pretrain.cli`` (train_pretrain) and ``transfer.cli`` (train_net, which imports detectron2
before anything of this project)."""

from __future__ import annotations

import pytest

from tests.helpers.mistakes import run_tool


@pytest.mark.parametrize("tool", ["tools/train_pretrain.py", "tools/train_net.py"])
def test_tools_do_not_print_the_jit_script_deprecation(tool):
    r = run_tool([tool, "-h"])
    assert r.returncode == 0, r.output
    assert "torch.jit.script" not in r.stderr, r.stderr
