"""Figures of the report. Figures are drawn on matplotlib's Agg canvas directly (no pyplot, no
global backend switch), so importing this module never changes a user's matplotlib setup."""
from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

PALETTE = "tab10"


def _figure(num_panels: int, ncols: int = 3, size: tuple[float, float] = (4.2, 3.2)):
    ncols = max(1, min(num_panels, ncols))
    nrows = math.ceil(num_panels / ncols)
    fig = Figure(figsize=(size[0] * ncols + 0.6, size[1] * nrows + 1.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=True).flat
    for ax in axes[num_panels:]:
        ax.set_visible(False)
    return fig, axes[:num_panels]


LINESTYLES = ("-", "--", ":", "-.")


def line_styles(names: list) -> dict:
    """{name: (colour, line style)}: ten colours, then the same colours with the next line style,
    so up to 40 names get distinct pairs (the one-panel-per-column figure; the report groups more
    than 8 curves by family, :func:`plot_acc_vs_cost_grouped`)."""
    cmap = colormaps[PALETTE]
    return {name: (cmap(i % cmap.N), LINESTYLES[(i // cmap.N) % len(LINESTYLES)])
            for i, name in enumerate(names)}


def panel_title(label: str) -> str:
    """A column label with its axes named: "(0.6,0.5)" -> "ρ=0.6, τ=0.5", "non-IID (0.7,10)" ->
    "non-IID p=0.7, α_Dir=10"."""
    label = re.sub(r"non-IID \(([^,()]+),([^,()]+)\)", r"non-IID p=\1, α_Dir=\2", str(label))
    return re.sub(r"\(([^,()]+),([^,()]+)\)", r"ρ=\1, τ=\2", label, count=1)


def plot_acc_vs_cost(curves: dict, path: str | Path, references: dict | None = None,
                     ylabel: str = "test accuracy (%)", groups: list[tuple[str, list]] | None = None,
                     baseline: str | None = None) -> Path:
    """Test accuracy (%) vs communication cost: one panel per column label, one line per row.

    ``curves`` is {panel title: {line name: (cost array, accuracy array)}}; ``references`` is
    {panel title: {name: accuracy}} for rows without communication (centralized training),
    drawn as horizontal lines in the same style. The legend sits under the panels. With ``groups``
    ([(group title, line names)]), :func:`plot_acc_vs_cost_grouped` draws one row of panels per group."""
    if groups:
        return plot_acc_vs_cost_grouped(curves, path, groups, references, ylabel, baseline)
    references = references or {}
    names = list(dict.fromkeys(name for part in (curves, references) for lines in part.values() for name in lines))
    styles = line_styles(names)
    titles = list(dict.fromkeys([*curves, *references]))
    fig, axes = _figure(len(titles), size=(4.6, 3.4))
    for ax, title in zip(axes, titles):
        for name, (cost, acc) in curves.get(title, {}).items():
            color, ls = styles[name]
            ax.plot(np.asarray(cost), np.asarray(acc), color=color, ls=ls, lw=1.3)
        for name, acc in references.get(title, {}).items():
            color, ls = styles[name]
            ax.axhline(acc, color=color, ls=ls, lw=1.1, alpha=0.9)
        ax.set_title(panel_title(title), fontsize=10)
        ax.set_xlabel("communication cost (client participations)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    central = {n for lines in references.values() for n in lines}
    handles = [Line2D([], [], color=styles[n][0], ls=styles[n][1], lw=1.5,
                      label=f"{n} (no communication: final acc.)" if n in central else str(n)) for n in names]
    ncols = max(1, min(len(names), 2 * min(len(titles), 3), 6))
    fig.legend(handles=handles, loc="outside lower center", ncols=ncols, fontsize=8, frameon=False)
    fig.savefig(path, dpi=120)
    return Path(path)


#: the horizontal reference lines of the grouped figure (centralized training): grey, told apart by style
REFERENCE_STYLES = (("0.35", ":"), ("0.35", "-."), ("0.6", ":"), ("0.6", "-."), ("0.35", (0, (5, 1, 1, 1, 1, 1))))


def plot_acc_vs_cost_grouped(curves: dict, path: str | Path, groups: list[tuple[str, list]],
                             references: dict | None = None, ylabel: str = "test accuracy (%)",
                             baseline: str | None = None) -> Path:
    """Accuracy vs cost with one row of panels per group (e.g. a method family), headed by its
    title, and one column per column label, all on one accuracy axis and, per column, one cost
    axis. A panel holds its group's lines (solid, distinct colours: keep groups to ten lines or
    fewer), the ``baseline`` row as a black dashed line and the ``references`` (no communication) as
    grey horizontal lines, both in every panel; each row's legend sits at its right, the shared
    lines' legend on top."""
    fig = grouped_figure(curves, groups, references, ylabel, baseline)
    fig.savefig(path, dpi=110)
    return Path(path)


def grouped_figure(curves: dict, groups: list[tuple[str, list]], references: dict | None = None,
                   ylabel: str = "test accuracy (%)", baseline: str | None = None) -> Figure:
    """The figure of :func:`plot_acc_vs_cost_grouped`, unsaved."""
    references = references or {}
    titles = list(dict.fromkeys([*curves, *references]))
    n, cmap = len(titles), colormaps[PALETTE]
    central = list(dict.fromkeys(name for lines in references.values() for name in lines))
    ref_style = {name: REFERENCE_STYLES[i % len(REFERENCE_STYLES)] for i, name in enumerate(central)}
    has_baseline = any(baseline in curves.get(t, {}) for t in titles)
    fig = Figure(figsize=(3.9 * n + 1.7, 2.9 * len(groups) + 1.0), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2 * len(groups), n + 1, width_ratios=[1] * n + [1.6 / 3.9],
                            height_ratios=[0.09, 1] * len(groups))
    first, column_axes = None, [None] * n
    for g, (group, names) in enumerate(groups):
        head = fig.add_subplot(grid[2 * g, :])
        head.axis("off")
        head.text(0, 0, group, fontsize=10, fontweight="bold", ha="left", va="bottom", transform=head.transAxes)
        for j, title in enumerate(titles):
            ax = fig.add_subplot(grid[2 * g + 1, j], sharey=first, sharex=column_axes[j])
            first, column_axes[j] = first or ax, column_axes[j] or ax
            _grouped_panel(ax, curves.get(title, {}), references.get(title, {}), names, ref_style,
                           baseline if has_baseline else None)
            ax.set_title(panel_title(title), fontsize=9)
            if j == 0:
                ax.set_ylabel(ylabel, fontsize=8)
            if g == len(groups) - 1:
                ax.set_xlabel("communication cost (client participations)", fontsize=8)
        legend = fig.add_subplot(grid[2 * g + 1, n])
        legend.axis("off")
        legend.legend(handles=[Line2D([], [], color=cmap(i % cmap.N), lw=2, label=str(name))
                               for i, name in enumerate(names)], loc="center left", fontsize=8, frameon=False)
    shared = [Line2D([], [], color="k", ls="--", lw=1.4, label=f"{baseline} (in every panel)")] if has_baseline else []
    shared += [Line2D([], [], color=c, ls=ls, lw=1.2, label=f"{name} (no communication: final acc.)")
               for name, (c, ls) in ref_style.items()]
    if shared:
        fig.legend(handles=shared, loc="outside upper center", ncols=len(shared), fontsize=8, frameon=False)
    return fig


def _grouped_panel(ax, lines: dict, references: dict, names: list, ref_style: dict, baseline) -> None:
    cmap = colormaps[PALETTE]
    for name, (color, ls) in ref_style.items():
        if name in references:
            ax.axhline(references[name], color=color, ls=ls, lw=1.2)
    if baseline in lines:
        ax.plot(np.asarray(lines[baseline][0]), np.asarray(lines[baseline][1]), color="k", ls="--", lw=1.4,
                zorder=3)  # on top: its gaps show a line it covers
    for i, name in enumerate(names):
        if name in lines:
            ax.plot(np.asarray(lines[name][0]), np.asarray(lines[name][1]), color=cmap(i % cmap.N), lw=1.4)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)


# ---------------------------------------------------------------- per-run figures (FedCorr Figs. 3-10)


def _single(ncols: int = 1, size: tuple[float, float] = (5.2, 3.8)):
    fig = Figure(figsize=(size[0] * ncols, size[1]), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(1, ncols, squeeze=False)[0]


def _save(fig: Figure, path: str | Path, title: str) -> Path:
    if title:  # wrapped to the figure's width (~12 characters per inch at 10 pt), never clipped
        fig.suptitle(textwrap.fill(title, max(30, int(12 * fig.get_figwidth()))), fontsize=10)
    fig.savefig(path, dpi=120)
    return Path(path)


def stage_spans(cost: np.ndarray, stages: list) -> list[tuple[str, float, float]]:
    """Consecutive runs of the same stage name as (name, first cost, last cost)."""
    spans: list[list] = []
    for c, s in zip(cost, stages):
        if s is None or (isinstance(s, float) and math.isnan(s)):
            continue
        if spans and spans[-1][0] == s:
            spans[-1][2] = c
        else:
            spans.append([s, c, c])
    return [(str(s), float(a), float(b)) for s, a, b in spans]


def plot_run_curve(cost, acc, stages, path: str | Path, title: str = "", ylabel: str = "test accuracy (%)",
                   selected: int | None = None) -> Path:
    """Test accuracy (%) vs communication cost of one run, each training stage shaded and named
    at the top, with a dashed line where a stage starts (FedCorr Fig. 9); the best evaluation is a
    star and ``selected`` (the index of the evaluation chosen on noisy validation) a diamond."""
    cost, acc = np.asarray(cost, float), np.asarray(acc, float)
    fig, (ax,) = _single(size=(6.4, 3.8))
    spans = stage_spans(cost, list(stages)) if stages is not None else []
    shade = colormaps["Pastel1"]
    for i, (name, start, end) in enumerate(spans):
        left = spans[i - 1][2] if i else min(start, 0.0)  # a stage begins where the previous ended
        ax.axvspan(left, end, color=shade(i % shade.N), alpha=0.5, lw=0)
        if i:
            ax.axvline(left, color="0.4", ls="--", lw=0.8)
        ax.text((left + end) / 2, 1.0, name, transform=ax.get_xaxis_transform(), ha="center", va="bottom",
                fontsize=8)
    ax.plot(cost, acc, color="C0", lw=1.3, marker="." if len(cost) < 60 else None, label="global model")
    if len(acc):
        best = int(np.nanargmax(acc))
        ax.plot(cost[best], acc[best], "r*", ms=9, label=f"best {acc[best]:.2f}%")
    if selected is not None and 0 <= selected < len(acc):
        ax.plot(cost[selected], acc[selected], "D", color="C2", mfc="none", ms=8, mew=1.5,
                label=f"selected on validation {acc[selected]:.2f}%")
    ax.set_xlabel("communication cost (client participations)")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path, title)


def _flat(values) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1)


def gmm_density(x: np.ndarray, gmm: dict) -> tuple[np.ndarray, np.ndarray]:
    """(mixture density, per-component weighted densities [K, len(x)]) of a 1-D GMM whose means,
    variances and weights may come in sklearn's shapes ((K, 1), (K, 1, 1), ...)."""
    means, var, weights = _flat(gmm["means"]), _flat(gmm["variances"]), _flat(gmm["weights"])
    comp = weights[:, None] * np.exp(-((x[None, :] - means[:, None]) ** 2) / (2 * var[:, None]))
    comp /= np.sqrt(2 * np.pi * var[:, None])
    return comp.sum(axis=0), comp


def _lid_histogram(ax, lid: np.ndarray, gmm: dict | None, truth, title: str, legend: bool = True) -> None:
    """Histogram of cumulative LID scores (stacked by the true clean/noisy clients when known)
    with the GMM's mixture density and its two weighted components."""
    finite = lid[np.isfinite(lid)]
    bins = np.histogram_bin_edges(finite, bins=min(30, max(5, len(finite) // 3)))
    if truth is not None and len(truth) == len(lid):
        clean, noisy = lid[~truth], lid[truth]
        ax.hist([clean[np.isfinite(clean)], noisy[np.isfinite(noisy)]], bins=bins, density=True, stacked=True,
                alpha=0.7, color=["C0", "C3"], label=["clean clients (truth)", "noisy clients (truth)"])
    else:
        ax.hist(finite, bins=bins, density=True, alpha=0.7, color="0.6", label="clients")
    if gmm:
        width = bins[-1] - bins[0]
        grid = np.linspace(bins[0] - 0.1 * width, bins[-1] + 0.1 * width, 400)
        total, comp = gmm_density(grid, gmm)
        ax.plot(grid, total, color="k", lw=1.5, label="GMM density")
        for k, c in enumerate(comp):
            ax.plot(grid, c, color="k", lw=0.8, ls=":", label="GMM components" if k == 0 else None)
    ax.set_xlabel("cumulative LID score")
    ax.set_ylabel("density")
    ax.set_title(title, fontsize=9)
    if legend:
        ax.legend(fontsize=7)


def _truth(truth) -> np.ndarray | None:
    return np.asarray(truth, dtype=bool) if truth is not None else None


def plot_lid_gmm(cumulative_lid, gmm: dict | None, predicted, truth, true_rate, path: str | Path,
                 title: str = "", iteration=None) -> Path:
    """Cumulative LID scores of the clients with the fitted two-component GMM (FedCorr Figs. 3, 6):
    left, their distribution split by the true clean/noisy clients with the GMM density; right,
    each client's score against its true noise level, coloured by the method's decision."""
    lid, truth = _flat(cumulative_lid), _truth(truth)
    fig, (left, right) = _single(2)
    _lid_histogram(left, lid, gmm, truth,
                   "distribution" + (f" after iteration {iteration}" if iteration is not None else ""))
    rate = _flat(true_rate) if true_rate is not None else np.full(len(lid), np.nan)
    pred = np.asarray(predicted, dtype=bool) if predicted is not None else None
    if pred is not None and len(pred) == len(lid):
        for flag, color, name in ((False, "C0", "identified clean"), (True, "C3", "identified noisy")):
            m = pred == flag
            right.scatter(rate[m], lid[m], s=14, color=color, label=name, alpha=0.8)
        right.legend(fontsize=7)
    else:
        right.scatter(rate, lid, s=14, color="0.3")
    right.set_xlabel("true noise level of the client")
    right.set_ylabel("cumulative LID score")
    right.set_title("per client", fontsize=9)
    right.grid(alpha=0.3)
    return _save(fig, path, title)


def plot_lid_iterations(records: list[dict], truth, path: str | Path, title: str = "") -> Path:
    """The cumulative LID distribution and its GMM after each iteration, one panel per iteration
    (``records``: dicts with ``iteration``, ``cumulative_lid`` and ``gmm``)."""
    truth = _truth(truth)
    ncols = min(len(records), 4)
    nrows = math.ceil(len(records) / ncols)
    fig = Figure(figsize=(3.6 * ncols, 2.9 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).flat
    for i, (ax, rec) in enumerate(zip(axes, records)):
        lid = np.array([np.nan if v is None else v for v in rec["cumulative_lid"]], dtype=float)
        _lid_histogram(ax, lid, rec.get("gmm"), truth, f"iteration {rec.get('iteration', i + 1)}", legend=i == 0)
    for ax in axes[len(records):]:
        ax.set_visible(False)
    return _save(fig, path, title)


def plot_noise_estimation(true_rate, mu_hat, flagged, path: str | Path, title: str = "") -> Path:
    """Estimated vs true noise level per client (FedCorr Fig. 7): left, clients sorted by their true
    level (bars) with the estimate (dots; crosses = flagged noisy); right, estimate vs truth."""
    true = _flat(true_rate)
    est = np.array([np.nan if v is None else float(v) for v in mu_hat])
    flag = np.array([bool(v) for v in flagged]) if flagged is not None else np.zeros(len(true), bool)
    order = np.argsort(np.nan_to_num(true, nan=-1.0), kind="stable")
    fig, (left, right) = _single(2)
    x = np.arange(len(true))
    left.bar(x, true[order], color="0.75", width=0.9, label="true noise level")
    left.scatter(x, est[order], s=10, color="C3", label="estimated $\\hat{\\mu}_k$", zorder=3)
    if flag.any():
        left.scatter(x[flag[order]], np.full(int(flag.sum()), -0.04), marker="x", s=12, color="k",
                     label="flagged noisy", clip_on=False)
    left.set_xlabel("client (sorted by true noise level)")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_ylabel("noise level")
    left.set_ylim(-0.07, 1.0)
    left.legend(fontsize=7, loc="upper left")
    known = np.isfinite(est) & np.isfinite(true)
    mae = float(np.mean(np.abs(est[known] - true[known]))) if known.any() else float("nan")
    _against_identity(right, true[known], est[known], "estimate = truth",
                      f"{int(known.sum())} clients estimated, MAE {mae:.3f}",
                      "true noise level", "estimated noise level")
    return _save(fig, path, title)


def _against_identity(ax, x, y, identity: str, title: str, xlabel: str, ylabel: str) -> None:
    """One value per client against another on [0, 1]², with the identity line for reference."""
    ax.scatter(x, y, s=12, color="C3")
    ax.plot([0, 1], [0, 1], color="0.4", ls="--", lw=0.8, label=identity)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")


def plot_partition(class_counts, path: str | Path, title: str = "") -> Path:
    """Samples per class held by each client (FedCorr Fig. 10): a dot per (client, class) whose
    area is proportional to the count; the bar on top gives each client's size."""
    counts = np.asarray(class_counts, dtype=float)
    n, m = counts.shape
    width, height = min(3.0 + 0.09 * n, 16.0), 1.6 + min(0.3 * m, 9.0)
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    top, ax = fig.subplots(2, 1, sharex=True, height_ratios=[1, 4])
    top.bar(np.arange(n), counts.sum(axis=1), color="0.5", width=0.8)
    top.set_ylabel("samples")
    # the largest dot fits its grid cell (marker area in pt^2; the axes take ~75% of the figure)
    cell = min(0.75 * width * 72 / n, 0.6 * height * 72 / m)
    area = min(150.0, (0.9 * cell) ** 2)
    cx, cy = np.nonzero(counts)
    ax.scatter(cx, cy, s=area * counts[cx, cy] / max(counts.max(), 1.0), color="C0", alpha=0.7, lw=0)
    ax.set_xlabel("client")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("class")
    ax.set_yticks(np.arange(m) if m <= 20 else np.linspace(0, m - 1, 11).round().astype(int))
    ax.set_ylim(-0.7, m - 0.3)
    ax.set_xlim(-0.7, n - 0.3)
    ax.grid(alpha=0.2)
    biggest = int(counts.max()) if counts.size else 0
    for value in sorted({max(biggest // 4, 1), max(biggest, 1)}):
        ax.scatter([], [], s=area * value / max(biggest, 1), color="C0", alpha=0.7, lw=0,
                   label=f"{value} samples")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return _save(fig, path, title or "class distribution per client")


def plot_confusion(before, after, path: str | Path, title: str = "") -> Path:
    """Observed vs clean labels before and after the method's corrections (FedCorr Fig. 8), each row
    normalised to % of that clean class; numbers printed when there are at most 15 classes. One
    panel when nothing was corrected."""
    mats = [np.asarray(m, dtype=float) for m in (before, after)]
    names = ["before correction", "after correction"]
    if np.array_equal(mats[0], mats[1]):  # the method corrected nothing: one panel
        mats, names = mats[:1], ["observed labels (no corrections)"]
    fig, axes = _single(len(mats), size=(4.6, 4.2))
    m = mats[0].shape[0]
    image = None
    for ax, mat, name in zip(axes, mats, names):
        rows = mat.sum(axis=1, keepdims=True)
        pct = 100.0 * np.divide(mat, rows, out=np.zeros_like(mat), where=rows > 0)
        noise = 100.0 * (1.0 - np.trace(mat) / mat.sum()) if mat.sum() else float("nan")
        image = ax.imshow(pct, cmap="Blues", vmin=0, vmax=100)
        ax.set_title(f"{name}: {noise:.2f}% noisy labels", fontsize=9)
        ax.set_xlabel("observed label")
        ax.set_ylabel("clean label")
        if m <= 15:
            ax.set_xticks(np.arange(m))
            ax.set_yticks(np.arange(m))
            for i in range(m):
                for j in range(m):
                    if pct[i, j] >= 0.5:
                        ax.text(j, i, f"{pct[i, j]:.0f}", ha="center", va="center", fontsize=6,
                                color="white" if pct[i, j] > 60 else "black")
    fig.colorbar(image, ax=list(axes), shrink=0.8, label="% of the clean class")
    return _save(fig, path, title)


def plot_noise_realised(requested, realised, noisy_client, path: str | Path, title: str = "") -> Path:
    """Requested noise level μ_k vs the realised share of noisy labels per client: clients sorted
    by μ_k, realised as bars (red = noisy client), requested as black ticks; right, the scatter."""
    mu, real = _flat(requested), _flat(realised)
    noisy = np.asarray(noisy_client, dtype=bool) if noisy_client is not None else mu > 0
    order = np.argsort(np.nan_to_num(mu, nan=-1.0), kind="stable")
    fig, (left, right) = _single(2)
    x = np.arange(len(mu))
    left.bar(x, real[order], width=0.9, color=np.where(noisy[order], "C3", "C0"), alpha=0.7)
    left.scatter(x, mu[order], marker="_", s=60, color="k", zorder=3)
    left.set_xlabel("client (sorted by requested level)")
    left.set_ylabel("noise level")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    left.legend(handles=[Line2D([], [], color="C3", lw=6, alpha=0.7, label="realised (noisy client)"),
                         Line2D([], [], color="C0", lw=6, alpha=0.7, label="realised (clean client)"),
                         Line2D([], [], color="k", marker="_", ls="", ms=10, label="requested μ_k")],
                fontsize=7, loc="upper left")
    known = np.isfinite(mu) & np.isfinite(real)
    gap = float(np.max(np.abs(real[known] - mu[known]))) if known.any() else float("nan")
    _against_identity(right, mu[known], real[known], "realised = requested",
                      f"{int(known.sum())} clients, largest gap {gap:.3f}",
                      "requested noise level μ_k", "realised noise level")
    return _save(fig, path, title)


def cd_cliques(mean_rank: dict, cd: float) -> list[tuple[int, int]]:
    """Maximal runs (i, j) of methods in rank order whose mean ranks differ by less than ``cd``
    (no significant difference between any two of them), as index pairs with j > i."""
    values = sorted(mean_rank.values())
    spans = []
    for i in range(len(values)):
        j = i
        while j + 1 < len(values) and values[j + 1] - values[i] < cd:
            j += 1
        if j > i and not any(a <= i and j <= b for a, b in spans):
            spans.append((i, j))
    return spans


#: label colours of the critical-difference diagram's groups (method families)
GROUP_PALETTE = "Dark2"


def plot_cd_diagram(mean_rank: dict, cd: float | None, path: str | Path, title: str = "",
                    groups: dict | None = None) -> Path:
    """Critical-difference diagram (Demšar 2006, Fig. 1): methods placed at their mean rank on an
    axis from 1 (best) to k, labels to the left (better half) and right; a thick bar joins methods
    whose mean ranks differ by less than the critical difference ``cd`` (drawn at the top). Without
    ``cd`` (not enough cells for a test) the ranks alone are drawn. With ``groups`` ({name: group},
    e.g. the method families, in their order) each label is coloured by its group, with a legend.
    The figure grows with the number of methods k, so every label keeps its own line."""
    names = sorted(mean_rank, key=lambda n: (mean_rank[n], str(n)))
    k = len(names)
    half = math.ceil(k / 2)
    colour = group_colours(names, groups)
    fig, (ax,) = _single(size=(max(7.2, 3.6 + 0.22 * k), 1.6 + 0.28 * half + (0.4 if colour else 0)))
    ax.set_xlim(0.2, k + 0.8)
    ax.set_ylim(-(0.9 * half + 0.8), 1.6)
    ax.axis("off")
    ax.hlines(0, 1, k, color="k", lw=1)
    step = 1 if k <= 20 else 5
    for r in range(1, k + 1):
        ax.vlines(r, 0, 0.15 if r % step == 0 or r == 1 else 0.08, color="k", lw=1)
        if r % step == 0 or r == 1:
            ax.text(r, 0.25, str(r), ha="center", va="bottom", fontsize=8)
    for i, name in enumerate(names):
        x = mean_rank[name]
        left = i < half
        level = -(i + 1 if left else k - i) * 0.9 - 0.3
        end = 0.4 if left else k + 0.6
        ax.plot([x, x, end], [0, level, level], color="0.3", lw=0.8)
        ax.text(end + (-0.05 if left else 0.05), level, f"{name} ({x:.2f})", ha="right" if left else "left",
                va="center", fontsize=8, color=colour.get(name, "k"))
    if cd is not None:
        ax.plot([1, 1 + cd], [1.15, 1.15], color="k", lw=1.5)
        ax.text(1 + cd / 2, 1.25, f"CD = {cd:.2f}", ha="center", va="bottom", fontsize=8)
        ordered = [mean_rank[n] for n in names]
        for line, (i, j) in enumerate(cd_cliques(mean_rank, cd)):
            y = -0.25 - 0.18 * line
            ax.plot([ordered[i] - 0.03, ordered[j] + 0.03], [y, y], color="k", lw=3, solid_capstyle="butt")
    if colour:
        shown = list(dict.fromkeys(groups[n] for n in groups if n in colour))
        handles = [Line2D([], [], color=colour[next(n for n in names if groups.get(n) == g)], lw=4, label=str(g))
                   for g in shown]
        fig.legend(handles=handles, loc="outside lower center", ncols=math.ceil(len(handles) / 2), fontsize=8,
                   frameon=False)
    return _save(fig, path, title)


def group_colours(names: list, groups: dict | None) -> dict:
    """{name: colour} by group, in the groups' order; {} without groups or with a single group."""
    if not groups or len({groups.get(n) for n in names}) < 2:
        return {}
    order = list(dict.fromkeys(groups[n] for n in groups))
    cmap = colormaps[GROUP_PALETTE]
    return {n: cmap(order.index(groups[n]) % cmap.N) for n in names if n in groups}


def panel_grid(names: list, groups: dict | None, ncols: int) -> list[tuple[int, int, str | None]]:
    """(row, column, heading) of each panel: ``ncols`` a row; with ``groups`` ({name: group} in
    order), each group starts a new row and its first panel of every row carries the group's name
    ("family (cont.)" on a continued row)."""
    places, row, col, previous = [], -1, ncols, object()
    for name in names:
        group = groups.get(name) if groups else None
        if (groups and group != previous) or col == ncols:
            row, col = row + 1, 0
            heading = None if not groups else (str(group) if group != previous else f"{group} (cont.)")
        else:
            heading = None
        places.append((row, col, heading))
        col, previous = col + 1, group
    return places


#: plot_clients draws up to this many panels in a plain grid; more: a row of panels per group
MAX_PANELS = 8


def plot_clients(panels: list[tuple], path: str | Path, title: str = "", groups: dict | None = None) -> Path:
    """Accuracy per client against its realised noise rate: one panel per row (method) in table
    order, one marker per client, filled for a noisy client and hollow for a clean one, one colour
    per column (setting); with more than ``MAX_PANELS`` panels and ``groups`` (method families) each
    group starts a row of panels, named at its left.
    ``panels``: [(name, {column: (noise rate, accuracy in %, noisy) per client})]."""
    columns = list(dict.fromkeys(c for _, panel in panels for c in panel))
    names = [name for name, _ in panels]
    grouped = groups and len(panels) > MAX_PANELS and len({groups.get(n) for n in names}) > 1
    groups = groups if grouped else None
    ncols = min(len(panels), 4 if len(panels) <= MAX_PANELS else 6)
    places = panel_grid(names, groups, ncols)
    nrows = places[-1][0] + 1
    fig = Figure(figsize=(2.75 * ncols + 0.8, 2.3 * nrows + 1.3), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(nrows, ncols)
    cmap = colormaps[PALETTE]
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(columns)}
    first, lowest = None, {}
    for (name, panel), (r, c, heading) in zip(panels, places):
        ax = fig.add_subplot(grid[r, c], sharex=first, sharey=first)
        first = first or ax
        for column, (rate, acc, noisy) in panel.items():
            for flag in (False, True):
                m = noisy == flag
                ax.scatter(rate[m], acc[m], s=11, lw=0.8, alpha=0.75, edgecolors=colour[column],
                           facecolors=colour[column] if flag else "none")
        ax.set_title(str(name), fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        if c == 0:
            label = "client accuracy (%)"
            ax.set_ylabel(f"{heading}\n{label}" if heading else label, fontsize=8)
        else:
            ax.tick_params(labelleft=False)
        lowest[c] = ax
    first.set_xlim(-0.05, 1.0)
    first.set_ylim(0, 100)
    for ax in lowest.values():
        ax.set_xlabel("realised noise rate", fontsize=8)
    handles = [Line2D([], [], marker="o", ls="", color=colour[c], ms=6, label=panel_title(c)) for c in columns]
    handles += [Line2D([], [], marker="o", ls="", color="0.3", ms=6, label="noisy client (filled)"),
                Line2D([], [], marker="o", ls="", color="0.3", mfc="none", ms=6, label="clean client (hollow)")]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize=8, frameon=False)
    return _save(fig, path, title)
