"""The demo's figures cannot drift apart between the docs: README's "The demo" and docs/demo.md's
status line give the same LORAC accuracy and minutes, and every other sentence or table row of
the README and docs/ that speaks of the demo and quotes an accuracy (``82.80 %``) or minutes
quotes README's (docs/checkpoints.md once said "about 11 minutes" and "82.7 %" of a recipe two
changes old)."""

from __future__ import annotations

import re

from tests.helpers import ROOT

README = ROOT / "README.md"
DEMO_DOC = ROOT / "docs" / "demo.md"
# an accuracy as the docs quote one (two digits, decimals) and a number of minutes
FIGURE = re.compile(r"\b(\d{2}\.\d+) ?%|(\d+(?:\.\d+)?) min(?:utes?)?\b")
MENTIONS_DEMO = re.compile(r"\bdemo\b|demo's|output/demo", re.I)


def _readme_demo_section() -> str:
    text = README.read_text()
    return re.search(r"^## The demo\n(.*?)^## ", text, re.M | re.S)[1]


def readme_figures() -> dict[str, str]:
    """README's figures of the demo: kNN top-1 of LORAC, random init, raw pixels; minutes."""
    text = " ".join(_readme_demo_section().split())
    m = re.search(
        r"gave ([\d.]+) % for LORAC vs ([\d.]+) % for random init and ([\d.]+) % for centred raw "
        r"pixels in a fresh clone \(`make demo`: exit 0 in ([\d.]+) minutes",
        text,
    )
    assert m, "README's demo paragraph no longer states its figures as this test reads them"
    return dict(zip(("lorac", "random", "pixels", "minutes"), m.groups(), strict=True))


def _units(text: str) -> list[str]:
    """Sentences of paragraphs, and table rows, with their line breaks joined."""
    units: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if lines and all(ln.lstrip().startswith("|") for ln in lines):
            units += lines
        else:
            units += re.split(r"(?<=[.!?])\s+(?=[A-Z(`*])", " ".join(ln.strip() for ln in lines))
    return units


def demo_figures_quoted(text: str) -> list[tuple[str, str]]:
    """``(figure, sentence)`` for every accuracy or minutes figure of a sentence or table row of
    ``text`` that mentions the demo."""
    found = []
    for unit in _units(text):
        if MENTIONS_DEMO.search(unit):
            found += [(acc or minutes, unit) for acc, minutes in FIGURE.findall(unit)]
    return found


def _other_docs() -> dict[str, str]:
    """README outside its demo section, and every doc but docs/demo.md."""
    docs = {README.name: README.read_text().replace(_readme_demo_section(), "")}
    for path in sorted((ROOT / "docs").glob("*.md")):
        if path != DEMO_DOC:
            docs[f"docs/{path.name}"] = path.read_text()
    return docs


def test_readme_and_the_demo_doc_give_the_same_figures():
    figures = readme_figures()
    status = " ".join(DEMO_DOC.read_text().split())
    m = re.search(r"\bShipped \(recipe \w+, below\): ([\d.]+) % in ([\d.]+) minutes", status)
    assert m, "docs/demo.md's status no longer reads 'Shipped (recipe X, below): A % in M minutes'"
    assert (m[1], m[2]) == (figures["lorac"], figures["minutes"])


def test_every_other_doc_quotes_the_demo_figures_of_the_readme():
    figures = set(readme_figures().values())
    wrong = [
        f"{name}: {figure} in: {unit}"
        for name, text in _other_docs().items()
        for figure, unit in demo_figures_quoted(text)
        if figure not in figures
    ]
    assert wrong == []


def test_the_figures_of_a_stale_line_are_found():
    """What the check reads: both figures of the old docs/checkpoints.md row; not the figures of
    a sentence that does not speak of the demo, nor counts and intervals."""
    old = (
        "| the demo's LORAC checkpoint | `make demo` writes `output/demo/model_final.pth` "
        "(about 11 minutes on 2 CPU cores) | 82.7 % kNN top-1 on Fashion-MNIST (README) |\n"
    )
    assert [f for f, _ in demo_figures_quoted(old)] == ["11", "82.7"]
    other = "The study took 84.4 min. It used the demo's budget, 5 seeds, 95 % intervals."
    assert demo_figures_quoted(other) == []
