"""Code says what it does and why, not its history: no line of the Python files of pretrain/,
transfer/, tools/, benchmarks/ and tests/, of the files of configs/ or of the Makefile, and no
file name among them, holds a date (YYYY-MM-DD), an issue number ("issue 42") or "today's".
The history lives in git and in the result pages of docs/."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import ROOT

HISTORY = re.compile(r"\b(?:19|20)\d\d-[01]\d-[0-3]\d|issues? ?#?\d+|today['’]s", re.IGNORECASE)
PYTHON_FOLDERS = ("pretrain", "transfer", "tools", "benchmarks", "tests")


def checked_files(root: Path) -> list[Path]:
    """Every file the rule covers (tests/golden/*.json is data and no Python file)."""
    files = [p for folder in PYTHON_FOLDERS for p in (root / folder).rglob("*.py")]
    files += [p for p in (root / "configs").rglob("*") if p.is_file() and p.suffix != ".pyc"]
    files.append(root / "Makefile")
    return sorted(p for p in files if p.resolve() != Path(__file__).resolve())


def history_lines(root: Path) -> list[str]:
    """``file:line: text`` for every line (line 0: the file's name) that carries history."""
    found = []
    for path in checked_files(root):
        rel = path.relative_to(root).as_posix()
        if HISTORY.search(rel):
            found.append(f"{rel}:0: {path.name}")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_the_pattern_finds_dates_issue_numbers_and_todays():
    hits = ["2026-11-25", "(issue 41)", "Issue 42:", "issue42.py", "issue #7", "today's one"]
    misses = ["BASE_LR 2026", "the issue here", "model_0000005.pth", "today the"]
    assert [s for s in hits if not HISTORY.search(s)] == []
    assert [s for s in misses if HISTORY.search(s)] == []


def test_no_file_carries_a_date_an_issue_number_or_todays():
    found = history_lines(ROOT)
    assert found == [], "history in code (say what the code does and why):\n" + "\n".join(found)
