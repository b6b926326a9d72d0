"""The bookkeeping of :class:`pretrain.diagnostics.cuda_syncs.SyncDebug`, as the
``warnings.showwarning`` it installs (CUDA's detector itself needs a GPU:
tests/pretrain/engine/test_gpu.py)."""

from __future__ import annotations

from types import SimpleNamespace

from pretrain.diagnostics.cuda_syncs import SyncDebug


def test_a_sync_is_charged_to_the_project_line_that_asked_for_it():
    """A sync reported in torch's own Python (as ``torch.cuda.synchronize``'s is) is charged to
    the innermost frame of this project, with its thread and stack; other warnings are not
    kept."""
    hook = SyncDebug()
    hook.trainer = SimpleNamespace(iter=3)

    def a_step_that_syncs():
        hook.showwarning(
            UserWarning("called a synchronizing CUDA operation"), UserWarning,
            "/x/site-packages/torch/cuda/__init__.py", 1281,
        )  # fmt: skip

    a_step_that_syncs()
    hook.showwarning(UserWarning("an unrelated warning"), UserWarning, "f.py", 1)
    assert len(hook.syncs) == 1
    sync = hook.syncs[0]
    assert sync["origin"] == "torch/cuda/__init__.py:1281"
    assert sync["where"].startswith("tests/pretrain/diagnostics/test_cuda_syncs.py:")
    assert sync["where"].endswith("(a_step_that_syncs)")
    assert sync["iteration"] == 3 and sync["thread"] == "MainThread"
