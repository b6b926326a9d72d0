"""What the docs say of the code holds: docs/pretraining.md's hidden files are skipped without
being counted (the page said they were counted), docs/evaluation.md's number of checkpoint
layouts is the reader's (it said three of twelve), the folders the docs' example commands write
into are git-ignored (``out/``, ``pretrained/`` and ``results/`` were not), and README.md stays
a page read in minutes: at most 150 lines, one command per stage, each command run or parsed
as its tool runs or parses it."""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torchvision

from pretrain.cli.launching import parse_launch_args
from pretrain.data.datasets import ImageFilesSource
from pretrain.engine.launch import argument_parser, load_args_config
from tests.helpers import ROOT, make_image_folder
from tests.helpers.checkpoints import CASES, write
from tests.helpers.mistakes import run_main, snapshot, tool_main
from transfer.checkpoint.layouts import LAYOUTS
from transfer.classification.config import linear_probe_defaults
from transfer.classification.config import load_config as load_classification_config
from transfer.cli.linear_probe import parse_args as linear_probe_args
from transfer.detection.config import load_config as load_detection_config
from transfer.detection.trainer import build_argument_parser

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150
# where an example command writes: an output option's value, or the converter's output file
_WRITTEN = re.compile(
    r"(?:--output-dir|OUTPUT_DIR|--out|--table-dir|--cache-dir)[ =]+([\w.-]+/[^\s`)]*)"
    r"|tools/(?:convert_to_d2|export_backbone)\.py \S+ ([\w.-]+/[^\s`)]*)"
)


def test_hidden_files_are_skipped_uncounted_as_the_pretraining_page_says(tmp_path, caplog):
    page = " ".join((ROOT / "docs" / "pretraining.md").read_text().split())
    assert "hidden files and folders are skipped without a count" in page
    photos = make_image_folder(tmp_path / "photos", classes=1, per_class=2)
    shutil.copy(photos / "class0" / "img0.png", photos / ".thumbnail.png")
    (photos / ".cache").mkdir()
    shutil.copy(photos / "class0" / "img1.jpg", photos / ".cache" / "img1.jpg")
    (photos / ".DS_Store").write_bytes(b"\0")
    (photos / "notes.txt").write_text("a sidecar")
    with caplog.at_level(logging.INFO, logger="pretrain.data.datasets"):
        source = ImageFilesSource(str(photos))
    assert len(source) == 2
    assert "1 files without an image suffix left out (1 .txt)" in caplog.text


def test_the_number_of_checkpoint_layouts_the_docs_give_is_the_readers():
    said = [
        (path.name, n)
        for path in DOCS
        for n in re.findall(r"any of the (\w+) layouts", " ".join(path.read_text().split()))
    ]
    assert said, "no doc gives the number of layouts any more: drop this test"
    assert [(name, n) for name, n in said if n != str(len(LAYOUTS))] == []


def _written_folders() -> set[str]:
    """The top folders, relative to the working directory, that the docs' commands write in."""
    found = set()
    for path in DOCS:
        text = path.read_text().replace("\\\n", " ")
        for groups in _WRITTEN.findall(text):
            written = next(g for g in groups if g)
            if not written.startswith(("/", "~", "$")):
                found.add(written.split("/")[0])
    return found


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout"
)
def test_the_folders_the_docs_examples_write_in_are_git_ignored():
    folders = _written_folders()
    assert {"out", "output", "pretrained"} <= folders
    r = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "--no-index", *(f"{f}/x" for f in folders)],
        capture_output=True,
        text=True,
    )
    ignored = {line.split("/")[0] for line in r.stdout.splitlines()}
    assert folders - ignored == set()


# ---------------------------------------------------------------------------------------------
# README.md: the door of the project, every command in it checked


def readme_commands() -> list[list[str]]:
    """The argv of every command line of README's ``bash`` blocks (continuations joined,
    comments dropped)."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.M | re.S)
    lines = "".join(blocks).replace("\\\n", " ").splitlines()
    return [argv for line in lines if (argv := shlex.split(line, comments=True))]


def _tool(argv: list[str]) -> str:
    """``make``, or the script of a ``python tools/<tool>.py`` line."""
    return argv[1] if argv[0] == "python" else argv[0]


def _args(argv: list[str]) -> list[str]:
    """The tool's arguments, shipped configs by absolute path (the checks run in an empty
    working directory)."""
    return [str(ROOT / a) if a.startswith("configs/") else a for a in argv[2:]]


def _make_target(argv: list[str], tmp_path: Path) -> None:
    assert re.search(rf"^{re.escape(argv[1])}:", (ROOT / "Makefile").read_text(), re.M), argv


def _pretrain_config(argv: list[str], tmp_path: Path) -> None:
    """Parsed and its config loaded (strict); test_readme_pretraining_commands.py also opens
    its data."""
    cfg = load_args_config(argument_parser("readme").parse_args(_args(argv)))
    assert argv[argv.index("OUTPUT_DIR") + 1] == cfg.OUTPUT_DIR


def _dry_run(argv: list[str], tmp_path: Path) -> None:
    """With ``--dry-run``: the sbatch scripts carry its flags; nothing is written or submitted."""
    before = snapshot(tmp_path)
    result = run_main(tool_main(argv[1]), [*_args(argv), "--dry-run"])
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --partition=gpu" in result.stdout.splitlines()
    assert snapshot(tmp_path) == before


def _convert(argv: list[str], tmp_path: Path) -> None:
    """Run on a ResNet-18 checkpoint of this project's layout where pretraining writes one."""
    source, target = tmp_path / argv[2], tmp_path / argv[3]
    source.parent.mkdir(parents=True)
    net = torchvision.models.resnet18()
    write(source, CASES["lorac"][2](net, net))
    result = run_main(tool_main(argv[1]), argv[2:])
    assert result.returncode == 0, result.stderr
    assert target.is_file()


def _detection_config(argv: list[str], tmp_path: Path) -> None:
    """Parsed as train_net parses it, its config loaded (strict: every key exists)."""
    args = parse_launch_args(build_argument_parser(), _args(argv), eval_only=True)
    cfg = load_detection_config(args.config_file, args.opts)
    assert argv[argv.index("MODEL.WEIGHTS") + 1] == cfg.MODEL.WEIGHTS


def _linear_probe_config(argv: list[str], tmp_path: Path) -> None:
    """Parsed as linear_probe parses it, its config loaded (strict)."""
    args = linear_probe_args(_args(argv))
    load_classification_config(linear_probe_defaults(), args.config_file, args.opts)
    assert args.checkpoint == argv[argv.index("--checkpoint") + 1]


def _export_block(argv: list[str], tmp_path: Path) -> None:
    """The export-example block, which tests/transfer/export/test_export_backbone.py runs in a
    fresh clone."""
    block = re.search(r"<!-- export-example -->\s*```bash\n(.*?)```", README.read_text(), re.S)
    assert block and shlex.split(block[1]) == argv


CHECKS = {
    "make": _make_target,
    "tools/train_pretrain.py": _pretrain_config,
    "tools/submit_pretrain.py": _dry_run,
    "tools/convert_to_d2.py": _convert,
    "tools/train_net.py": _detection_config,
    "tools/linear_probe.py": _linear_probe_config,
    "tools/study.py": _dry_run,
    "tools/export_backbone.py": _export_block,
}


def test_the_readme_is_at_most_150_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move details to docs/"


def test_the_readme_has_the_two_commands_and_one_command_per_stage():
    """``make demo``, ``make test``, then pretrain, on SLURM, convert, detect, evaluate, study
    and export, in that order; each tool has its check in ``CHECKS``."""
    commands = readme_commands()
    assert [argv[1] for argv in commands if argv[0] == "make"] == ["demo", "test"]
    stages = [_tool(argv) for argv in commands if argv[0] != "make"]
    assert stages == [tool for tool in CHECKS if tool != "make"]


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda argv: " ".join(argv[:2]))
def test_readme_command_runs_or_parses_as_written(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    CHECKS[_tool(argv)](argv, tmp_path)


def test_each_readme_stage_reads_what_the_one_before_writes():
    stage = {_tool(argv): argv for argv in readme_commands() if argv[0] == "python"}

    def value(tool: str, key: str) -> str:
        return stage[tool][stage[tool].index(key) + 1]

    run = value("tools/train_pretrain.py", "OUTPUT_DIR")
    assert value("tools/submit_pretrain.py", "OUTPUT_DIR") == run
    convert = stage["tools/convert_to_d2.py"]
    assert convert[2] == f"{run}/model_final.pth"
    assert value("tools/train_net.py", "MODEL.WEIGHTS") == convert[3]
    assert value("tools/linear_probe.py", "--checkpoint") == convert[2]
