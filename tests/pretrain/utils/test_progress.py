"""Progress in a log that is not a terminal: a few whole short lines, never tqdm's redraws."""

from __future__ import annotations

import io
import sys

import torch

from pretrain.evaluation.features import embed
from pretrain.utils.progress import MAX_LINE, LineProgress, progress


def test_a_non_terminal_gets_a_line_per_tenth_and_no_carriage_returns(tmp_path, monkeypatch):
    # the evaluations' feature loop with stderr redirected to a file, as `tool 2> log.txt` does
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        monkeypatch.setattr(sys, "stderr", f)
        batches = [(torch.zeros(2, 3), torch.zeros(2)) for _ in range(1000)]
        feats, _ = embed(lambda x: x, batches, desc="x" * 300)  # too long a description
    assert feats.shape == (2000, 3)
    err = log.read_text()
    lines = err.splitlines()
    assert "\r" not in err
    assert 10 <= len(lines) <= 11, lines  # 10 %, 20 %, ..., 90 %, and the end
    assert all(len(line) <= MAX_LINE for line in lines)
    assert "(1000/1000 batch" in lines[-1]


def test_update_counts_and_a_terminal_gets_tqdm():
    out = io.StringIO()
    with progress(total=50, desc="imgs", unit="img", file=out) as bar:
        assert isinstance(bar, LineProgress)
        for _ in range(5):
            bar.update(10)
    assert out.getvalue().splitlines()[-1].startswith("imgs: 100% (50/50 img")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert type(progress(range(3), file=Tty())).__name__ == "tqdm"
    assert list(progress(range(3), disable=True)) == [0, 1, 2]
