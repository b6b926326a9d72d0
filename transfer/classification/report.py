"""The columns of the tables shaped like the paper's Tables 1-3 (one row per model, written by
:func:`transfer.tables.update_table`; percentages with two decimals) and the Table 2 bar chart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = [
    "LINEAR_COLUMNS",
    "SEMI_COLUMNS",
    "pct",
    "plot_transfer_bars",
    "transfer_columns",
]

LINEAR_COLUMNS = ["Method", "arch.", "pars. (M)", "batchsize", "epochs", "Top-1", "Top-5"]
SEMI_COLUMNS = ["Model", "1% Top-1", "1% Top-5", "10% Top-1", "10% Top-5"]


def transfer_columns(dataset_names: Sequence[str]) -> list[str]:
    return ["Model", *dataset_names, "Average"]


def pct(x: float) -> str:
    """A fraction in [0, 1] as a percentage string with two decimals."""
    return f"{100.0 * x:.2f}"


def plot_transfer_bars(
    png_path: str,
    rows: Sequence[Mapping[str, str]],
    datasets: Sequence[str],
    title: str = "Linear classification on other tasks",
) -> None:
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
    ax.set_title(title)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
