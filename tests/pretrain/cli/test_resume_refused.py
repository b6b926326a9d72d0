"""``tools/train_pretrain.py`` into a finished run with one key changed: one ``error:`` line,
exit 2, no traceback, and the run directory byte for byte as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def _run(opts: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "tools" / "train_pretrain.py"), "--config-file",
           DEMO_CONFIG, *opts]  # fmt: skip
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_changed_key_is_refused_in_one_line_and_nothing_changes(tmp_path):
    data, out = make_image_folder(tmp_path / "data"), tmp_path / "run"
    assert _run(tiny_opts(data, out)).returncode == 0
    before = _files(out)
    r = _run(tiny_opts(data, out, **{"MODEL.QUEUE_SIZE": 64}))
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "MODEL.QUEUE_SIZE: saved 32, now 64" in errors[0]
    assert "Traceback" not in r.stderr
    assert _files(out) == before
    # the same command again: the finished run is not trained again, and nothing is lost
    again = _run(tiny_opts(data, out))
    assert again.returncode == 0 and "nothing left to train" in again.stderr + again.stdout
    assert (out / "model_final.pth").read_bytes() == before["model_final.pth"]
    # with --resume-with-changes a lower lr and a longer schedule extend the finished
    # run, recorded (refused without the flag: tests/pretrain/engine/test_resume_with_changes.py)
    longer = tiny_opts(data, out, **{"SOLVER.MAX_ITER": 8, "SOLVER.BASE_LR": 0.01})
    r = _run(["--resume-with-changes", *longer])
    assert r.returncode == 0, r.stderr[-2000:]
    [entry] = json.loads((out / "config_changes.json").read_text())
    assert entry["iteration"] == 6 and entry["max_iter"] == {"from": 6, "to": 8}
    assert entry["changes"]["SOLVER.BASE_LR"]["to"] == 0.01
    assert (out / "model_0000005.pth").read_bytes() == before["model_final.pth"]
    assert (out / "config.before_change_1.yaml").read_bytes() == before["config.yaml"]


def test_a_failed_rerun_changes_nothing(tmp_path):
    """The same command after the data moved: the rerun fails (one error line naming the root)
    and the finished run directory is byte for byte as it was."""
    data, out = make_image_folder(tmp_path / "data"), tmp_path / "run"
    assert _run(tiny_opts(data, out)).returncode == 0
    before = _files(out)
    data.rename(tmp_path / "moved")
    r = _run(tiny_opts(data, out))
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(data) in errors[0] and "Traceback" not in r.stderr
    assert _files(out) == before
