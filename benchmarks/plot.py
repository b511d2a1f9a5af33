"""Charts shared by the benchmark scripts (imported as ``plot``: a script's own folder is first
on ``sys.path``).

matplotlib is imported only when a chart is drawn, on the Agg backend (no display: the
benchmarks run on servers and in CI), so a script that only measures never loads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib's ``pyplot``, on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def line_chart(
    series: Mapping[str, Mapping[str, float]],
    path: Path,
    *,
    xlabel: str,
    ylabel: str,
    title: str | None = None,
    log2_x: bool = False,
) -> None:
    """Write a 6 x 4 inch line chart to ``path``: one line with round markers per entry of
    ``series`` (its legend label), whose points map an integer x, kept as a string as in the
    JSON the figures come from, to y; points are drawn in ascending x, the y axis starts at 0."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, points in series.items():
        xs = sorted(int(k) for k in points)
        ax.plot(xs, [points[str(x)] for x in xs], marker="o", label=label)
    if log2_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title, fontsize=9)
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
