"""The report's content, built by :mod:`.report` and rendered by it and :mod:`.report_html`: a
:class:`Section` holds paragraphs, :class:`Figure` s and tables."""

from __future__ import annotations

from dataclasses import dataclass, field

from transfer.analysis.report_tables import Table

__all__ = ["Figure", "Section"]


@dataclass
class Figure:
    title: str
    path: str  # PNG under OUT/figures
    caption: str = ""
    points: int | None = None  # data values drawn (figures this report plots itself)


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
