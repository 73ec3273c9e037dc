"""The report's figures: matplotlib on the headless Agg canvas (no pyplot, no display).

Every figure is ``FIGSIZE`` inches at ``DPI`` (so ``FIGSIZE * DPI`` pixels) and is written as
a PNG. Window figures take a :class:`~lightning_rex.tools.windows.Windows` (one run's records
as arrays).

Ranks that would draw the same line are drawn once:
:func:`~lightning_rex.tools.windows.rank_groups` puts ranks of one device (where the records
name it), with the same plan throughout and mean compute times within ``GROUP_TOLERANCE`` of
each other, in one group, drawn as its median line over its min-max band and labelled with
the device and the ranks (``A100: ranks 0-2``). With more than ``MAX_RANK_LINES`` groups, a
figure draws that many (spread over the groups ordered by mean compute time, the fastest and
slowest included) over the min/median/max band of all ranks. In the p-value figure each
proposal's marker says which test started it
(:func:`~lightning_rex.tools.windows.proposal_cause`): only a proposal on a single window's
imbalance has to sit below alpha. Accepts and rollbacks are the validation test's outcomes,
not the imbalance test's: they sit on a strip of their own above the p-values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from lightning_rex.tools.windows import (
    MAX_RANK_LINES,
    PROPOSAL_CAUSES,
    Windows,
    labelled_groups,
    nan_matrix,
    pick_ranks,
    proposal_cause,
    quiet_numpy,
)

__all__ = [
    "DPI",
    "FIGSIZE",
    "MAX_RANK_LINES",
    "Windows",
    "pick_ranks",
    "plot_comparison",
    "plot_compute",
    "plot_plan",
    "plot_pvalues",
    "plot_throughput",
]

DPI = 100
FIGSIZE = (10.0, 4.5)
P_FLOOR = 1e-12
VLINE = {"rollback": ("tab:red", "--")}  # plan-change lines; others: grey dotted
VALIDATION = {  # the validation test's outcomes, as the legend says them
    "accept": "new plan kept (validated)",
    "rollback": "new plan rolled back (slower)",
}
STYLE = {  # decision -> (colour, marker)
    "propose": ("tab:orange", "^"),
    "accept": ("tab:green", "o"),
    "rollback": ("tab:red", "v"),
    "recommend": ("tab:purple", "s"),
}


def _figure(title: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    axes = fig.subplots()
    axes.set_title(title, fontsize=11)
    axes.grid(True, alpha=0.3)
    return fig, axes


def _colour(i: int, n: int) -> Any:
    """The ``i``-th of ``n`` line colours (tab10, or tab20 beyond 10 lines)."""
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return cmap(i % cmap.N)


def _save(fig: Figure, path: str | Path) -> Path:
    png_path = Path(path)
    fig.savefig(png_path, dpi=DPI, format="png")
    return png_path


def _legend(ax: Axes) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ncol = 1 if len(handles) <= 12 else 2
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, ncol=ncol)


def _mark_changes(ax: Axes, w: Windows) -> None:
    seen: set[str] = set()
    for start_step, kind in w.changes:
        colour, line_style = VLINE.get(kind, ("0.3", ":"))
        label = None if kind in seen else f"plan change ({kind})"
        seen.add(kind)
        ax.axvline(start_step, color=colour, ls=line_style, lw=1.2, label=label)


def _rank_lines(ax: Axes, x: np.ndarray, y: np.ndarray, w: Windows, step: bool = False) -> None:
    """One line per group of equal ranks (its band behind it).

    With more groups than ``MAX_RANK_LINES``, some are left out, over the band of all ranks.
    """
    plot_kwargs: dict[str, Any] = {"drawstyle": "steps-post"} if step else {}
    groups = labelled_groups(w)
    if len(groups) > MAX_RANK_LINES:
        keep = set(pick_ranks(w.median_ms[:, [g.ranks[0] for g in groups]]))
        groups = [g for i, g in enumerate(groups) if i in keep]
        with quiet_numpy():
            low, mid, high = np.nanmin(y, 1), np.nanmedian(y, 1), np.nanmax(y, 1)
        ax.fill_between(
            x,
            low,
            high,
            color="0.6",
            alpha=0.3,
            label=f"min-max of {y.shape[1]}",
            step="post" if step else None,
        )
        ax.plot(x, mid, color="k", ls="--", lw=1.2, label="median rank", **plot_kwargs)
    for index, group in enumerate(groups):
        colour = _colour(index, len(groups))
        sub = y[:, group.ranks]
        if len(group.ranks) > 1:
            with quiet_numpy():
                low, line, high = np.nanmin(sub, 1), np.nanmedian(sub, 1), np.nanmax(sub, 1)
            if np.any(high > low):
                ax.fill_between(
                    x, low, high, color=colour, alpha=0.2, step="post" if step else None
                )
        else:
            line = sub[:, 0]
        ax.plot(x, line, lw=1.0, color=colour, label=group.label, **plot_kwargs)


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def plot_compute(w: Windows, path: str | Path, title: str = "") -> Path:
    """Each rank's median compute time per window, with plan changes as vertical lines.

    Args:
        w: The run's windows.
        path: The PNG to write.
        title: A title prefix (the run).

    Returns:
        ``path``.
    """
    fig, axes = _figure(f"{title}compute time per rank (window median)")
    _rank_lines(axes, w.step, w.median_ms, w)
    _mark_changes(axes, w)
    axes.set_xlabel("step (window end)")
    axes.set_ylabel("compute time [ms]")
    _legend(axes)
    return _save(fig, path)


def plot_plan(w: Windows, path: str | Path, end_step: float, title: str = "") -> Path:
    """The plan (each rank's micro-batch) over steps, as a step plot.

    Args:
        w: The run's windows.
        path: The PNG to write.
        end_step: The step the last plan is drawn to.
        title: A title prefix (the run).

    Returns:
        ``path``.
    """
    rows = [p for _, p in w.plans] or [[]]
    starts = [st for st, _ in w.plans] or [0]
    steps = np.array([*starts, max(end_step, starts[-1])], dtype=np.float64)
    totals = [sum(p) for p in rows]
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    if len(set(totals)) > 1:  # the global batch changed: a panel of its own below
        axes, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
        ax2.plot(steps, [*totals, totals[-1]], color="k", drawstyle="steps-post", lw=1.5)
        ax2.set_ylabel("global batch")
        ax2.set_xlabel("step")
        ax2.grid(True, alpha=0.3)
    else:
        axes = fig.subplots()
        axes.set_xlabel("step")
    axes.set_title(f"{title}plan: micro-batch per rank", fontsize=11)
    axes.grid(True, alpha=0.3)
    sizes = nan_matrix([*rows, rows[-1]], w.median_ms.shape[1])
    _rank_lines(axes, steps, sizes, w, step=True)
    _mark_changes(axes, w)
    axes.set_ylabel("micro-batch [samples]")
    _legend(axes)
    return _save(fig, path)


def plot_pvalues(w: Windows, path: str | Path, alpha: float, title: str = "") -> Path:
    """The imbalance test's p-values (log scale) against alpha, with the decisions marked.

    Args:
        w: The run's windows.
        path: The PNG to write.
        alpha: The significance level drawn as a horizontal line.
        title: A title prefix (the run).

    Returns:
        ``path``.
    """
    fig, axes = _figure(f"{title}imbalance test: adjusted p-value per rank")
    p_values = np.clip(w.p_values, P_FLOOR, 1.0)
    tested = np.isfinite(p_values).any(axis=1)
    axes.set_yscale("log")
    if tested.any():
        groups = labelled_groups(w)
        if len(groups) > MAX_RANK_LINES:
            keep = set(pick_ranks(w.median_ms[:, [g.ranks[0] for g in groups]]))
            groups = [g for i, g in enumerate(groups) if i in keep]
        for index, group in enumerate(groups):
            with quiet_numpy():
                group_p = np.nanmin(p_values[:, group.ranks], axis=1)
            finite = np.isfinite(group_p)
            if finite.any():
                axes.plot(
                    w.step[finite],
                    group_p[finite],
                    ".",
                    ms=4,
                    alpha=0.7,
                    color=_colour(index, len(groups)),
                    label=group.label,
                )
        with quiet_numpy():
            low = np.nanmin(p_values[tested], axis=1)
        axes.plot(w.step[tested], low, "-", color="k", lw=1.0, label="min over ranks")
    else:
        _empty(axes, "no p-values in these records")
    axes.axhline(alpha, color="tab:red", ls="--", lw=1.5, label=f"alpha = {alpha:g}")
    marks: dict[tuple[str, str, str], list[int]] = {}  # (label, colour, marker) -> windows
    for index, decision in enumerate(w.decisions):
        if decision not in STYLE:
            continue
        colour, marker = STYLE[decision]
        label = VALIDATION.get(decision, decision)
        if decision in ("propose", "recommend"):
            text, marker = PROPOSAL_CAUSES[proposal_cause(w.reasons[index] if w.reasons else "")]
            label = text.replace("propose", decision, 1)
        marks.setdefault((label, colour, marker), []).append(index)
    strip = 4.0  # above p = 1: where the validation outcomes sit
    for (label, colour, marker), window_indices in marks.items():
        if label in VALIDATION.values():
            heights = [strip] * len(window_indices)
        else:
            with quiet_numpy():
                heights = [
                    np.nanmin(p_values[i]) if np.isfinite(p_values[i]).any() else 1.0
                    for i in window_indices
                ]
        axes.scatter(
            w.step[window_indices],
            heights,
            s=60,
            color=colour,
            marker=marker,
            zorder=3,
            edgecolors="k",
            label=label,
        )
    axes.axhline(1.0, color="0.5", lw=0.8)
    axes.text(
        0.005,
        strip,
        " validation",
        transform=axes.get_yaxis_transform(),
        va="center",
        fontsize=8,
        color="0.3",
    )
    axes.set_ylim(
        max(P_FLOOR, min(alpha, float(np.nanmin(p_values)) if tested.any() else 1.0) / 3), 8.0
    )
    axes.set_xlabel("step (window end)")
    axes.set_ylabel("p-value")
    _legend(axes)
    return _save(fig, path)


def plot_throughput(w: Windows, path: str | Path, title: str = "", headline: str = "") -> Path:
    """Global throughput per window, against the even split's estimate and the limit.

    Args:
        w: The run's windows.
        path: The PNG to write.
        title: A title prefix (the run).
        headline: A line under the title (the run's speedup over the even split).

    Returns:
        ``path``.
    """
    fig, axes = _figure(f"{title}global throughput" + (f"\n{headline}" if headline else ""))
    measured = np.isfinite(w.throughput)
    if measured.any():
        axes.plot(
            w.step[measured],
            w.throughput[measured],
            "-",
            color="tab:blue",
            lw=1.2,
            label="measured",
        )
    else:
        _empty(axes, "no throughput in these records")
    even = np.isfinite(w.even[:, 0]) if len(w.even) else np.zeros(len(w.step), bool)
    if even.any():
        even_steps, estimate = w.step[even], w.even[even]
        axes.fill_between(
            even_steps,
            estimate[:, 1],
            estimate[:, 2],
            color="tab:orange",
            alpha=0.25,
            label="95% interval",
        )
        axes.plot(
            even_steps,
            estimate[:, 0],
            "--",
            color="tab:orange",
            lw=1.2,
            label="even split (estimated)",
        )
    lim = np.isfinite(w.limit)
    if lim.any():
        axes.plot(w.step[lim], w.limit[lim], "--", color="k", lw=1.2, label="limit (oracle)")
    _mark_changes(axes, w)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("step (window end)")
    axes.set_ylabel("samples / s")
    _legend(axes)
    return _save(fig, path)


def plot_comparison(
    data: Mapping[str, Mapping[str, tuple[float, float | None, float | None]]],
    path: str | Path,
    title: str = "efficiency per scenario (95% interval over seeds)",
) -> Path:
    """Each policy's efficiency per scenario, with its interval as error bars.

    Args:
        data: Per scenario, per policy, ``(centre, low, high)``; the interval may be None
            (a single seed).
        path: The PNG to write.
        title: The title.

    Returns:
        ``path``.
    """
    fig, axes = _figure(title)
    scenarios = list(data)
    policies = list(dict.fromkeys(p for s in scenarios for p in data[s]))
    width = 0.8 / max(len(policies), 1)
    for policy_index, pol in enumerate(policies):
        positions: list[float] = []
        centres: list[float] = []
        err: list[list[float]] = [[], []]
        for scenario_index, scenario in enumerate(scenarios):
            if pol not in data[scenario]:
                continue
            centre, low, high = data[scenario][pol]
            positions.append(scenario_index - 0.4 + width * (policy_index + 0.5))
            centres.append(centre)
            err[0].append(0.0 if low is None or not math.isfinite(low) else max(centre - low, 0.0))
            err[1].append(
                0.0 if high is None or not math.isfinite(high) else max(high - centre, 0.0)
            )
        axes.errorbar(positions, centres, yerr=err, fmt="o", ms=6, capsize=4, lw=1.5, label=pol)
    axes.axhline(1.0, color="k", ls="--", lw=1.0, label="limit (oracle)")
    axes.set_xticks(range(len(scenarios)), scenarios, rotation=0 if len(scenarios) < 5 else 20)
    axes.set_xlim(-0.6, len(scenarios) - 0.4)
    axes.set_ylabel("efficiency (throughput / limit)")
    _legend(axes)
    return _save(fig, path)
