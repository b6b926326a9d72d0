"""``tools/train_pretrain.py`` into a finished run with one key changed: one ``error:`` line,
exit 2, no traceback, and the run directory byte for byte as it was. The tool's ``main`` runs in
this process (:func:`tests.helpers.mistakes.run_main`: its exit status, output and logs as a
process gives them)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import make_image_folder, tiny_opts
from tests.helpers.mistakes import ToolResult, run_main, tool_main
from transfer.classification.demo import DEMO_CONFIG

TOOL = "tools/train_pretrain.py"


def _run(opts: list[str]) -> ToolResult:
    return run_main(tool_main(TOOL), ["--config-file", DEMO_CONFIG, *opts])


def _opts(data: Path, out: Path, **extra) -> list[str]:
    """The tiny run with its final checkpoint only (no periodic one: fewer bytes to write)."""
    return tiny_opts(data, out, **{"SOLVER.CHECKPOINT_PERIOD": 100, **extra})


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_a_changed_key_is_refused_in_one_line_and_nothing_changes(tmp_path):
    data, out = make_image_folder(tmp_path / "data"), tmp_path / "run"
    assert _run(_opts(data, out)).returncode == 0
    before = _files(out)
    r = _run(_opts(data, out, **{"MODEL.QUEUE_SIZE": 64}))
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "MODEL.QUEUE_SIZE: saved 32, now 64" in errors[0]
    assert "Traceback" not in r.stderr
    assert _files(out) == before
    # the same command again: the finished run is not trained again, and nothing is lost
    again = _run(_opts(data, out))
    assert again.returncode == 0 and "nothing left to train" in again.output
    assert (out / "model_final.pth").read_bytes() == before["model_final.pth"]
    # with --resume-with-changes a lower lr and a longer schedule extend the finished
    # run, recorded (refused without the flag: tests/pretrain/engine/test_resume_with_changes.py)
    longer = _opts(data, out, **{"SOLVER.MAX_ITER": 8, "SOLVER.BASE_LR": 0.01})
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
    assert _run(_opts(data, out)).returncode == 0
    before = _files(out)
    data.rename(tmp_path / "moved")
    r = _run(_opts(data, out))
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(data) in errors[0] and "Traceback" not in r.stderr
    assert _files(out) == before
