"""A tool prints its own lines, not its libraries' noise: library warnings and torch's log lines
(its "No CUDA runtime is found, using CUDA_HOME=..." notice, which detectron2's environment
report set off in every tool) are hidden unless ``--verbose`` is on the command line, while the
project's own warnings stay; and ``knn_eval``'s data workers fit the cores, so that torch's
"This DataLoader will create 4 worker processes" warning is not raised at all on 2 cores."""

from __future__ import annotations

import logging
import warnings

import pytest

from pretrain.cli.quiet import run_quietly
from pretrain.cli.user_errors import exit_on_user_error
from tests.helpers.classification import make_knn_fashion_mnist
from tests.helpers.mistakes import run_main
from tests.helpers.quiet import (
    CUDA_HOME_NOTICE,
    WORKER_WARNING,
    patch_two_cores,
    redo_cuda_home_notice,
)
from transfer.cli import knn_eval


@exit_on_user_error
def _noisy_tool(argv: list[str] | None = None) -> int:
    """Warns from a library module and from the project, and logs torch's notice."""
    warnings.warn_explicit("a library warning", UserWarning, "lib.py", 1, module="torch.lib")
    warnings.warn_explicit("a project warning", UserWarning, "p.py", 1, module="pretrain.p")
    logging.getLogger("torch.utils.cpp_extension").warning(f"{CUDA_HOME_NOTICE}='/usr'")
    print(f"argv {argv}")
    return 0


def test_library_output_is_hidden_unless_verbose_and_project_warnings_stay():
    quiet = run_main(_noisy_tool, ["--x", "1"])
    assert quiet.returncode == 0 and "argv ['--x', '1']" in quiet.stdout
    assert "a project warning" in quiet.stderr
    assert "a library warning" not in quiet.stderr and CUDA_HOME_NOTICE not in quiet.stderr
    loud = run_main(_noisy_tool, ["--x", "--verbose", "1"])
    assert loud.returncode == 0 and "argv ['--x', '1']" in loud.stdout  # the parser never sees it
    for line in ("a project warning", "a library warning", CUDA_HOME_NOTICE):
        assert line in loud.stderr


def test_the_filters_and_levels_of_before_are_back_after_a_tool():
    torch_logger = logging.getLogger("torch")
    before = (list(warnings.filters), torch_logger.level)
    assert run_quietly(lambda argv=None: 0, ["--x"]) == 0
    assert (list(warnings.filters), torch_logger.level) == before


@pytest.fixture
def knn_argv(tmp_path) -> list[str]:
    root = make_knn_fashion_mnist(str(tmp_path / "fm"))
    return ["--random-init", "resnet18", "--dataset", "fashion-mnist", "--data-root", root,
            "--image-size", "32", "--k", "5", "--device", "cpu"]  # fmt: skip


def test_knn_eval_on_two_cores_prints_no_notice_and_no_warning(knn_argv, tmp_path, monkeypatch):
    patch_two_cores(monkeypatch)
    redo_cuda_home_notice(monkeypatch, tmp_path)
    r = run_main(knn_eval.main, [*knn_argv, "--output-dir", str(tmp_path / "out")])
    assert r.returncode == 0, r.output
    assert "CUDA_HOME" not in r.output and "Warning" not in r.output, r.output


def test_knn_eval_verbose_shows_the_notice_and_its_workers_fit_two_cores(
    knn_argv, tmp_path, monkeypatch
):
    """With every library line shown, still no loader-worker warning: the default is one worker
    per core less one (``--num-workers -1``), as in pretraining, not 4."""
    patch_two_cores(monkeypatch)
    notice = redo_cuda_home_notice(monkeypatch, tmp_path)
    r = run_main(knn_eval.main, [*knn_argv, "--output-dir", str(tmp_path / "out"), "--verbose"])
    assert r.returncode == 0, r.output
    assert WORKER_WARNING not in r.output, r.output
    assert (CUDA_HOME_NOTICE in r.output) is notice, r.output
