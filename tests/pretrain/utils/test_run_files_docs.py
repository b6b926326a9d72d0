"""docs/layout.md says which run files each run writes: every run writes ``config.yaml`` and
``env.txt``; ``args.json`` only a tool configured by arguments alone (``knn_eval``), not every
run."""

from __future__ import annotations

import re

from fvcore.common.config import CfgNode

from pretrain.utils.run_setup import ARGS_FILE, setup_run
from tests.helpers import ROOT


def _writers_of_args_json() -> set[str]:
    """The modules that pass ``args`` to dump_run_info (the only writer of args.json)."""
    found = set()
    for path in [*ROOT.glob("pretrain/**/*.py"), *ROOT.glob("transfer/**/*.py")]:
        if re.search(r"dump_run_info\([^)]*args=", path.read_text()):
            found.add(path.stem)
    return found


def test_layout_names_the_runs_that_write_args_json(tmp_path):
    cfg = CfgNode({"OUTPUT_DIR": str(tmp_path / "run"), "SEED": 0})
    setup_run(cfg, None)  # the setup of pretraining, detection and the classification tools
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["config.yaml", "env.txt",
                                                                    "log.txt"]  # fmt: skip
    assert not (tmp_path / "run" / ARGS_FILE).exists()
    assert _writers_of_args_json() == {"knn_eval"}
    row = next(line for line in (ROOT / "docs" / "layout.md").read_text().splitlines()
               if line.startswith("| run setup"))  # fmt: skip
    assert "`config.yaml` + `env.txt` written once per run" in row
    assert "(`args.json` too for `knn_eval`, the one tool configured by arguments alone)" in row
