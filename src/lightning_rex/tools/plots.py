"""The report's figures: matplotlib on the headless Agg canvas (no pyplot, no display).

Every figure is ``FIGSIZE`` inches at ``DPI`` (so ``FIGSIZE * DPI`` pixels) and is written as
a PNG. Window figures take a :class:`Windows` (the records of one run as arrays, ranks
padded with NaN where a record's plan is shorter, so a run whose world size or global batch
changed still plots); with more than ``MAX_RANK_LINES`` ranks, a figure draws that many
ranks (spread over the ranks ordered by mean compute time, the fastest and slowest
included) over the min/median/max band of all of them.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

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
MAX_RANK_LINES = 16
P_FLOOR = 1e-12
VLINE = {"rollback": ("tab:red", "--")}  # plan-change lines; others: grey dotted
STYLE = {  # decision -> (colour, marker)
    "propose": ("tab:orange", "^"),
    "accept": ("tab:green", "o"),
    "rollback": ("tab:red", "v"),
    "recommend": ("tab:purple", "s"),
}


def _matrix(rows: Sequence[Sequence[float | None] | None], width: int) -> np.ndarray:
    out = np.full((len(rows), width), np.nan)
    for i, row in enumerate(rows):
        for j, v in enumerate(row or []):
            out[i, j] = np.nan if v is None else float(v)
    return out


def _vector(values: Sequence[Any]) -> np.ndarray:
    return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)


@dataclass
class Windows:
    """The records of one run as arrays, one row per window.

    Attributes:
        step: Each window's end step, shape ``(W,)``.
        median_ms: Per-rank median compute time, ``(W, N)``, NaN where a rank is absent.
        p_values: Per-rank p-values, ``(W, N)``, NaN where the record has none.
        throughput: Global samples per second, ``(W,)``, NaN where unknown.
        limit: The limit throughput (simulator runs), ``(W,)``, NaN where unknown.
        decisions: Each window's decision.
        plans: ``(first step, plan)`` of every plan in force, in order.
        changes: ``(effective step, decision)`` of every applied plan change.
    """

    step: np.ndarray
    median_ms: np.ndarray
    p_values: np.ndarray
    throughput: np.ndarray
    limit: np.ndarray
    decisions: list[str]
    plans: list[tuple[int, list[int]]]
    changes: list[tuple[int, str]]

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> Windows:
        """Build the arrays from window records (``rex_decisions.jsonl`` lines).

        Args:
            records: One run's records, in order.

        Returns:
            The arrays.
        """
        n = max([len(r["plan"]) for r in records] + [1])
        plans: list[tuple[int, list[int]]] = []
        changes: list[tuple[int, str]] = []
        for r in records:
            timeline = [(int(r["window"][0]), list(r["plan"]))]
            if r.get("effective_step") is not None and r.get("new_plan") is not None:
                changes.append((int(r["effective_step"]), str(r["decision"])))
                timeline.append((int(r["effective_step"]), list(r["new_plan"])))
            for st, plan in timeline:
                if not plans or (plan != plans[-1][1] and st >= plans[-1][0]):
                    plans.append((st, plan))
        return cls(
            step=_vector([r["step"] for r in records]),
            median_ms=_matrix([r["median_ms"] for r in records], n),
            p_values=_matrix([r.get("p_values") for r in records], n),
            throughput=_vector([r.get("global_samples_per_s") for r in records]),
            limit=_vector([r.get("limit_samples_per_s") for r in records]),
            decisions=[str(r["decision"]) for r in records],
            plans=plans,
            changes=changes,
        )


def pick_ranks(median_ms: np.ndarray, max_lines: int = MAX_RANK_LINES) -> list[int]:
    """The ranks to draw as lines: all of them, or ``max_lines`` spread over the ranks.

    Args:
        median_ms: Per-rank values, shape ``(W, N)`` (NaN allowed).
        max_lines: The most lines.

    Returns:
        Rank indices, ascending: with more ranks than ``max_lines``, ranks at evenly spaced
        positions of the order by mean value (the fastest and the slowest included).
    """
    n = median_ms.shape[1]
    if n <= max_lines:
        return list(range(n))
    with _quiet():
        mean = np.nanmean(np.where(np.isfinite(median_ms), median_ms, np.nan), axis=0)
    order = np.argsort(np.nan_to_num(mean, nan=-np.inf), kind="stable")
    idx = np.unique(np.linspace(0, n - 1, max_lines).round().astype(int))
    return sorted(int(order[i]) for i in idx)


def _figure(title: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ax.set_title(title, fontsize=11)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _colour(i: int, n: int) -> Any:
    """The ``i``-th of ``n`` line colours (tab10, or tab20 beyond 10 lines)."""
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return cmap(i % cmap.N)


def _save(fig: Figure, path: str | Path) -> Path:
    p = Path(path)
    fig.savefig(p, dpi=DPI, format="png")
    return p


def _legend(ax: Axes) -> None:
    handles, _ = ax.get_legend_handles_labels()
    if handles:
        ncol = 1 if len(handles) <= 12 else 2
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, ncol=ncol)


def _mark_changes(ax: Axes, w: Windows) -> None:
    seen: set[str] = set()
    for st, kind in w.changes:
        colour, ls = VLINE.get(kind, ("0.3", ":"))
        label = None if kind in seen else f"plan change ({kind})"
        seen.add(kind)
        ax.axvline(st, color=colour, ls=ls, lw=1.2, label=label)


def _rank_lines(
    ax: Axes, x: np.ndarray, y: np.ndarray, ranks: Sequence[int], step: bool = False
) -> None:
    """Lines of ``ranks``, over the band of all ranks when some are left out."""
    kw: dict[str, Any] = {"drawstyle": "steps-post"} if step else {}
    if len(ranks) < y.shape[1]:
        with _quiet():
            lo, mid, hi = np.nanmin(y, 1), np.nanmedian(y, 1), np.nanmax(y, 1)
        ax.fill_between(
            x,
            lo,
            hi,
            color="0.6",
            alpha=0.3,
            label=f"min-max of {y.shape[1]}",
            step="post" if step else None,
        )
        ax.plot(x, mid, color="k", ls="--", lw=1.2, label="median rank", **kw)
    for i, r in enumerate(ranks):
        ax.plot(x, y[:, r], lw=1.0, color=_colour(i, len(ranks)), label=f"rank {r}", **kw)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence numpy's warnings on all-NaN slices in a block."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


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
    fig, ax = _figure(f"{title}compute time per rank (window median)")
    _rank_lines(ax, w.step, w.median_ms, pick_ranks(w.median_ms))
    _mark_changes(ax, w)
    ax.set_xlabel("step (window end)")
    ax.set_ylabel("compute time [ms]")
    _legend(ax)
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
    x = np.array([*starts, max(end_step, starts[-1])], dtype=np.float64)
    totals = [sum(p) for p in rows]
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    if len(set(totals)) > 1:  # the global batch changed: a panel of its own below
        ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
        ax2.plot(x, [*totals, totals[-1]], color="k", drawstyle="steps-post", lw=1.5)
        ax2.set_ylabel("global batch")
        ax2.set_xlabel("step")
        ax2.grid(True, alpha=0.3)
    else:
        ax = fig.subplots()
        ax.set_xlabel("step")
    ax.set_title(f"{title}plan: micro-batch per rank", fontsize=11)
    ax.grid(True, alpha=0.3)
    y = _matrix([*rows, rows[-1]], w.median_ms.shape[1])
    _rank_lines(ax, x, y, pick_ranks(w.median_ms), step=True)
    _mark_changes(ax, w)
    ax.set_ylabel("micro-batch [samples]")
    _legend(ax)
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
    fig, ax = _figure(f"{title}imbalance test: adjusted p-value per rank")
    p = np.clip(w.p_values, P_FLOOR, 1.0)
    tested = np.isfinite(p).any(axis=1)
    ax.set_yscale("log")
    if tested.any():
        ranks = pick_ranks(w.median_ms)
        for i, r in enumerate(ranks):
            ok = np.isfinite(p[:, r])
            if ok.any():
                ax.plot(
                    w.step[ok],
                    p[ok, r],
                    ".",
                    ms=4,
                    alpha=0.7,
                    color=_colour(i, len(ranks)),
                    label=f"rank {r}",
                )
        with _quiet():
            low = np.nanmin(p[tested], axis=1)
        ax.plot(w.step[tested], low, "-", color="k", lw=1.0, label="min over ranks")
    else:
        _empty(ax, "no p-values in these records")
    ax.axhline(alpha, color="tab:red", ls="--", lw=1.5, label=f"alpha = {alpha:g}")
    for kind, (colour, marker) in STYLE.items():
        at = [i for i, d in enumerate(w.decisions) if d == kind]
        if at:
            with _quiet():
                y = [np.nanmin(p[i]) if np.isfinite(p[i]).any() else 1.0 for i in at]
            ax.scatter(
                w.step[at],
                y,
                s=60,
                color=colour,
                marker=marker,
                zorder=3,
                edgecolors="k",
                label=kind,
            )
    ax.set_ylim(max(P_FLOOR, min(alpha, float(np.nanmin(p)) if tested.any() else 1.0) / 3), 2.0)
    ax.set_xlabel("step (window end)")
    ax.set_ylabel("p-value")
    _legend(ax)
    return _save(fig, path)


def plot_throughput(w: Windows, path: str | Path, title: str = "") -> Path:
    """Global throughput per window, against the limit where the records carry one.

    Args:
        w: The run's windows.
        path: The PNG to write.
        title: A title prefix (the run).

    Returns:
        ``path``.
    """
    fig, ax = _figure(f"{title}global throughput")
    ok = np.isfinite(w.throughput)
    if ok.any():
        ax.plot(w.step[ok], w.throughput[ok], "-", color="tab:blue", lw=1.2, label="measured")
    else:
        _empty(ax, "no throughput in these records")
    lim = np.isfinite(w.limit)
    if lim.any():
        ax.plot(w.step[lim], w.limit[lim], "--", color="k", lw=1.2, label="limit (oracle)")
    _mark_changes(ax, w)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("step (window end)")
    ax.set_ylabel("samples / s")
    _legend(ax)
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
    fig, ax = _figure(title)
    scenarios = list(data)
    policies = list(dict.fromkeys(p for s in scenarios for p in data[s]))
    width = 0.8 / max(len(policies), 1)
    for j, pol in enumerate(policies):
        xs: list[float] = []
        ys: list[float] = []
        err: list[list[float]] = [[], []]
        for i, s in enumerate(scenarios):
            if pol not in data[s]:
                continue
            c, lo, hi = data[s][pol]
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(c)
            err[0].append(0.0 if lo is None or not math.isfinite(lo) else max(c - lo, 0.0))
            err[1].append(0.0 if hi is None or not math.isfinite(hi) else max(hi - c, 0.0))
        ax.errorbar(xs, ys, yerr=err, fmt="o", ms=6, capsize=4, lw=1.5, label=pol)
    ax.axhline(1.0, color="k", ls="--", lw=1.0, label="limit (oracle)")
    ax.set_xticks(range(len(scenarios)), scenarios, rotation=0 if len(scenarios) < 5 else 20)
    ax.set_xlim(-0.6, len(scenarios) - 0.4)
    ax.set_ylabel("efficiency (throughput / limit)")
    _legend(ax)
    return _save(fig, path)
