"""Markdown / CSV tables shaped like the paper's Tables 1-3, and the Table 2 bar chart.

A table is a CSV file with one row per model; running a tool again for another model (same
output directory) adds or updates that model's row, and the Markdown twin is regenerated from
the CSV. Accuracies are stored as percentages with two decimals.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence

__all__ = [
    "LINEAR_COLUMNS",
    "SEMI_COLUMNS",
    "markdown_table",
    "plot_transfer_bars",
    "transfer_columns",
    "update_table",
    "write_markdown",
]

LINEAR_COLUMNS = ["Method", "arch.", "pars. (M)", "batchsize", "epochs", "Top-1", "Top-5"]
SEMI_COLUMNS = ["Model", "1% Top-1", "1% Top-5", "10% Top-1", "10% Top-5"]


def transfer_columns(dataset_names: Sequence[str]) -> list[str]:
    return ["Model", *dataset_names, "Average"]


def pct(x: float) -> str:
    """A fraction in [0, 1] as a percentage string with two decimals."""
    return f"{100.0 * x:.2f}"


def read_rows(csv_path: str) -> list[dict[str, str]]:
    if not os.path.isfile(csv_path):
        return []
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


def update_table(
    csv_path: str, columns: Sequence[str], row: Mapping[str, object], title: str = ""
) -> list[dict[str, str]]:
    """Merge ``row`` into the row with the same first-column value (or append it), rewrite the
    CSV and ``<same name>.md``; columns beyond ``columns`` found in the file are kept."""
    key = columns[0]
    if key not in row:
        raise ValueError(f"row needs the key column {key!r}")
    rows = read_rows(csv_path)
    cols = list(columns)
    for r in rows:
        cols += [c for c in r if c not in cols]
    cols += [c for c in row if c not in cols]
    new = {k: "" if v is None else str(v) for k, v in row.items()}
    for r in rows:
        if r.get(key) == new[key]:
            r.update({k: v for k, v in new.items() if v != ""})
            break
    else:
        rows.append(new)
    os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cols, restval="")
        writer.writeheader()
        writer.writerows(rows)
    write_markdown(os.path.splitext(csv_path)[0] + ".md", cols, rows, title)
    return rows


def markdown_table(columns: Sequence[str], rows: Sequence[Mapping[str, object]]) -> list[str]:
    """The lines of a Markdown table: first column left-aligned, the others right; empty -> "-"."""
    lines = ["| " + " | ".join(columns) + " |"]
    lines.append("|" + "|".join([":---"] + ["---:"] * (len(columns) - 1)) + "|")
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) or "-" for c in columns) + " |")
    return lines


def write_markdown(
    md_path: str, columns: Sequence[str], rows: Sequence[Mapping[str, str]], title: str = ""
) -> None:
    lines = [f"# {title}", ""] if title else []
    lines += markdown_table(columns, rows)
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")


def plot_transfer_bars(png_path: str, rows: Sequence[Mapping[str, str]], datasets: Sequence[str]):
    """Grouped bars: one group per dataset (and Average), one bar per model row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [d for d in [*datasets, "Average"] if any(r.get(d) for r in rows)]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(groups) + 2), 4.0))
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        values = [float(r[d]) if r.get(d) else 0.0 for d in groups]
        xs = [g + (i - (len(rows) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=r.get("Model", f"model {i}"))
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=30, ha="right")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Linear classification on other tasks")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
