"""Figures of the report. Figures are drawn on matplotlib's Agg canvas directly (no pyplot, no
global backend switch), so importing this module never changes a user's matplotlib setup."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

PALETTE = "tab10"


def _figure(num_panels: int, ncols: int = 3, size: tuple[float, float] = (4.2, 3.2)):
    ncols = max(1, min(num_panels, ncols))
    nrows = math.ceil(num_panels / ncols)
    fig = Figure(figsize=(size[0] * ncols + 1.8, size[1] * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True).flat
    for ax in axes[num_panels:]:
        ax.set_visible(False)
    return fig, axes[:num_panels]


def _colors(names: list) -> dict:
    cmap = colormaps[PALETTE]
    return {name: cmap(i % cmap.N) for i, name in enumerate(names)}


def plot_acc_vs_cost(curves: dict, path: str | Path) -> Path:
    """Test accuracy (%) vs communication cost: one panel per column label, one line per row.

    ``curves`` is {panel title: {line name: (cost array, accuracy array)}}."""
    names = list(dict.fromkeys(name for lines in curves.values() for name in lines))
    colors = _colors(names)
    fig, axes = _figure(len(curves))
    for ax, (title, lines) in zip(axes, curves.items()):
        for name, (cost, acc) in lines.items():
            ax.plot(np.asarray(cost), np.asarray(acc), color=colors[name], lw=1.2, label=str(name))
        ax.set_title(str(title), fontsize=10)
        ax.set_xlabel("communication cost (client participations)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("test accuracy (%)")
    handles = [Line2D([], [], color=colors[n], label=str(n)) for n in names]
    fig.legend(handles=handles, loc="outside right upper", fontsize=9)
    fig.savefig(path, dpi=120)
    return Path(path)
