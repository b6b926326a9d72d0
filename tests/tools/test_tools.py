"""The tools are thin scripts over console-script mains, user errors end every tool the same way,
and the shipped configs are found as package data."""

from __future__ import annotations

import ast
import filecmp
import importlib
import importlib.util
import os
from pathlib import Path

import pytest

from pretrain.cli.user_errors import exit_on_user_error
from pretrain.cluster.submit import ENTRIES
from pretrain.utils.errors import USER_ERROR_EXIT_CODE, ConfigError
from tests.helpers import ROOT
from transfer.shipped_configs import config_path


def _setup_tools() -> dict[str, str]:
    """setup.py's TOOLS: tool name -> module holding its main."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    assigned = [n for n in tree.body if isinstance(n, ast.Assign)]
    (node,) = [n for n in assigned if n.targets[0].id == "TOOLS"]
    return ast.literal_eval(node.value)


def test_every_tool_wraps_the_main_of_its_console_script():
    """Each tools/*.py but the pre-install detectron2 installer only imports ``main`` from the
    module setup.py installs as its console script, and calls it under ``__main__``."""
    scripts = {p.stem: p for p in (ROOT / "tools").glob("*.py") if p.stem != "install_detectron2"}
    tools = _setup_tools()
    assert sorted(scripts) == sorted(tools)
    for name, path in scripts.items():
        body = ast.parse(path.read_text()).body
        imports = [n for n in body if isinstance(n, ast.ImportFrom | ast.Import)]
        assert len(body) == 3 and len(imports) == 1, f"{path}: more than a thin wrapper"
        assert imports[0].module == tools[name] and [a.name for a in imports[0].names] == ["main"]
        assert callable(importlib.import_module(tools[name]).main)


def test_submit_entries_are_runnable_modules():
    """``python -m MODULE`` works for every job kind (installed packages, no repository path)."""
    for module in ENTRIES.values():
        assert importlib.util.find_spec(module) is not None, module
        assert callable(importlib.import_module(module).main)


def test_every_shipped_config_is_package_data():
    """The lookup finds every YAML under configs/, byte for byte, subfolders included (under a
    regular install this also proves that package_data's glob covers them all)."""
    shipped = sorted(p.relative_to(ROOT / "configs") for p in (ROOT / "configs").rglob("*.yaml"))
    assert len(shipped) > 40
    for rel in shipped:
        found = config_path(rel.as_posix())
        assert os.path.isfile(found) and filecmp.cmp(found, ROOT / "configs" / rel, shallow=False)
    assert Path(config_path()).samefile(Path(config_path("pretrain/Base-MoCoV2.yaml")).parents[1])


def test_user_error_is_one_line_and_exit_status_2(capsys):
    @exit_on_user_error
    def tool(argv: list[str]) -> int:
        if argv:
            raise ConfigError(f"{argv[0]}: SOLVER.LR = 'x' is not a number\n(see the docs)")
        return 0

    assert tool([]) == 0
    with pytest.raises(SystemExit) as e:
        tool(["a.yaml"])
    assert e.value.code == USER_ERROR_EXIT_CODE == 2
    assert (
        capsys.readouterr().err == "error: a.yaml: SOLVER.LR = 'x' is not a number (see the docs)\n"
    )


def test_bugs_keep_their_traceback_and_a_worker_user_error_ends_the_parent_quietly(capsys):
    """A non-user error propagates unchanged; detectron2's launch reporting a worker that exited
    with status 2 (it printed the error line) ends the parent with status 2 and no more output,
    any other worker exit propagates."""
    from torch.multiprocessing import ProcessExitedException

    def raising(exc: BaseException):
        @exit_on_user_error
        def tool() -> int:
            raise exc

        return tool

    with pytest.raises(KeyError):
        raising(KeyError("bug"))()
    with pytest.raises(SystemExit) as e:
        raising(ProcessExitedException("worker", error_index=0, error_pid=1, exit_code=2))()
    assert e.value.code == 2 and capsys.readouterr().err == ""
    with pytest.raises(ProcessExitedException):
        raising(ProcessExitedException("worker", error_index=0, error_pid=1, exit_code=1))()
