"""The report's data: a run's window records as arrays, and which ranks draw one line.

:class:`Windows` holds one run's records as arrays (ranks padded with NaN where a record's plan
is shorter, so a run whose world size or global batch changed still plots), each rank's device
(the records' ``devices``) and each window's reason. :func:`rank_groups` finds the ranks that
would draw the same line, :func:`pick_ranks` the ranks to draw when there are too many, and
:func:`proposal_cause` the test behind each proposal. :mod:`lightning_rex.tools.plots` draws
them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_rex.tools.headline import even_split_series

__all__ = [
    "GROUP_TOLERANCE",
    "MAX_RANK_LINES",
    "PROPOSAL_CAUSES",
    "Group",
    "Windows",
    "device_label",
    "labelled_groups",
    "nan_matrix",
    "pick_ranks",
    "proposal_cause",
    "quiet_numpy",
    "rank_groups",
]

MAX_RANK_LINES = 16
"""The most rank lines (or groups) a figure draws."""
GROUP_TOLERANCE = 0.1
"""Ranks of one device and plan are drawn as one group when their mean compute times differ
by less than this fraction."""

PROPOSAL_CAUSES = {  # cause -> (legend text, marker)
    "cold start": ("propose: first window imbalanced (tested by device kind)", "^"),
    "persistent": ("propose: imbalance lasted several windows (tested together)", ">"),
    "refined": ("propose: a kept plan, still imbalanced, refined", "<"),
    "bounds": ("propose: the plan broke the size bounds (no test)", "D"),
    "other": ("propose", "^"),
}
"""How the p-value figure marks each kind of proposal: a proposal's test is not always the
single window's p-value drawn there (see :func:`proposal_cause`)."""


def nan_matrix(rows: Sequence[Sequence[float | None] | None], width: int) -> np.ndarray:
    """Rows of values as a ``(len(rows), width)`` array, NaN where a row is short or None.

    Args:
        rows: The rows (None for a missing row; None entries are NaN).
        width: The columns.

    Returns:
        The array.
    """
    out = np.full((len(rows), width), np.nan)
    for row_index, row in enumerate(rows):
        for column, value in enumerate(row or []):
            out[row_index, column] = np.nan if value is None else float(value)
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
        reasons: Each window's reason (empty where the record has none).
        devices: Each rank's device label (:func:`device_label`), None where unknown.
        even: The even split's estimated throughput, ``(W, 3)`` (mean, low, high) samples/s,
            NaN where unknown (:func:`~lightning_rex.tools.headline.even_split_series`).
    """

    step: np.ndarray
    median_ms: np.ndarray
    p_values: np.ndarray
    throughput: np.ndarray
    limit: np.ndarray
    decisions: list[str]
    plans: list[tuple[int, list[int]]]
    changes: list[tuple[int, str]]
    reasons: list[str] = dataclasses.field(default_factory=list)
    devices: list[str | None] = dataclasses.field(default_factory=list)
    even: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 3)))

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> Windows:
        """Build the arrays from window records (``rex_decisions.jsonl`` lines).

        Args:
            records: One run's records, in order.

        Returns:
            The arrays.
        """
        num_ranks = max([len(r["plan"]) for r in records] + [1])
        plans: list[tuple[int, list[int]]] = []
        changes: list[tuple[int, str]] = []
        for record in records:
            timeline = [(int(record["window"][0]), list(record["plan"]))]
            if record.get("effective_step") is not None and record.get("new_plan") is not None:
                changes.append((int(record["effective_step"]), str(record["decision"])))
                timeline.append((int(record["effective_step"]), list(record["new_plan"])))
            for start_step, plan in timeline:
                if not plans or (plan != plans[-1][1] and start_step >= plans[-1][0]):
                    plans.append((start_step, plan))
        return cls(
            step=_vector([r["step"] for r in records]),
            median_ms=nan_matrix([r["median_ms"] for r in records], num_ranks),
            p_values=nan_matrix([r.get("p_values") for r in records], num_ranks),
            throughput=_vector([r.get("global_samples_per_s") for r in records]),
            limit=_vector([r.get("limit_samples_per_s") for r in records]),
            decisions=[str(r["decision"]) for r in records],
            plans=plans,
            changes=changes,
            reasons=[str(r.get("reason") or "") for r in records],
            devices=_devices(records, num_ranks),
            even=nan_matrix(even_split_series(records), 3),
        )


def device_label(key: Any) -> str | None:
    """A record's device key as a legend label: the simulator's ``sim:`` prefix dropped.

    Args:
        key: One entry of a record's ``devices``.

    Returns:
        The label, or None for an unknown or unlabelled device (``None``, ``""``, ``"sim"``).
    """
    if not isinstance(key, str) or key in ("", "sim"):
        return None
    return key.removeprefix("sim:") or None


def _devices(records: Sequence[Mapping[str, Any]], n: int) -> list[str | None]:
    """Each rank's device from the last record that names as many devices as ranks."""
    for record in reversed(records):
        keys = record.get("devices")
        if isinstance(keys, list) and len(keys) == n:
            return [device_label(k) for k in keys]
    return [None] * n


def proposal_cause(reason: str) -> str:
    """Which test started a proposal, from its record's reason.

    Args:
        reason: The record's ``reason``.

    Returns:
        A key of :data:`PROPOSAL_CAUSES`.
    """
    if "refined" in reason:
        return "refined"
    if "cold start" in reason:
        return "cold start"
    if "persistent" in reason:
        return "persistent"
    if "size bounds" in reason:
        return "bounds"
    return "other"


def _ranges(ranks: Sequence[int], most: int = 3) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``; beyond ``most`` runs, ``0, 5, 10, ... (64 ranks)``."""
    out: list[str] = []
    start = prev = ranks[0]
    for rank in [*ranks[1:], None]:
        if rank is not None and rank == prev + 1:
            prev = rank
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if rank is not None:
            start = prev = rank
    if len(out) > most:
        return f"{', '.join(out[:most])}, ... ({len(ranks)} ranks)"
    return ", ".join(out)


@dataclass
class Group:
    """Ranks drawn as one line.

    Attributes:
        ranks: The ranks, ascending.
        label: The legend label.
    """

    ranks: list[int]
    label: str


def rank_groups(w: Windows, tolerance: float = GROUP_TOLERANCE) -> list[list[int]]:
    """Ranks that draw the same line: one device, one plan throughout, near-equal times.

    Args:
        w: The run's windows.
        tolerance: The largest relative difference of mean compute time within a group.

    Returns:
        Groups of ranks, each ascending, ordered by their first rank; ranks the records do
        not group stay alone.
    """
    num_ranks = w.median_ms.shape[1]
    plans = nan_matrix([p for _, p in w.plans] or [[]], num_ranks)
    devices = w.devices if len(w.devices) == num_ranks else [None] * num_ranks
    with quiet_numpy():
        mean = np.nanmean(w.median_ms, axis=0) if len(w.step) else np.full(num_ranks, np.nan)
    groups: list[list[int]] = []
    for rank in range(num_ranks):
        for group in groups:
            first = group[0]
            same_plan = np.array_equal(plans[:, first], plans[:, rank], equal_nan=True)
            first_mean, rank_mean = mean[first], mean[rank]
            near = (np.isnan(first_mean) and np.isnan(rank_mean)) or bool(
                abs(first_mean - rank_mean) <= tolerance * max(abs(first_mean), abs(rank_mean))
            )
            if devices[first] == devices[rank] and same_plan and near:
                group.append(rank)
                break
        else:
            groups.append([rank])
    return groups


def labelled_groups(w: Windows) -> list[Group]:
    """The groups of :func:`rank_groups`, labelled: ``rank 3 (A100)``, ``A100: ranks 0-2``.

    Args:
        w: The run's windows.

    Returns:
        The groups, ordered by their first rank.
    """
    num_ranks = w.median_ms.shape[1]
    devices = w.devices if len(w.devices) == num_ranks else [None] * num_ranks
    out = []
    for group in rank_groups(w):
        dev = devices[group[0]]
        if len(group) == 1:
            label = f"rank {group[0]}" + (f" ({dev})" if dev else "")
        else:
            label = (f"{dev}: " if dev else "") + f"ranks {_ranges(group)}"
        out.append(Group(group, label))
    return out


def pick_ranks(median_ms: np.ndarray, max_lines: int = MAX_RANK_LINES) -> list[int]:
    """The ranks to draw as lines: all of them, or ``max_lines`` spread over the ranks.

    Args:
        median_ms: Per-rank values, shape ``(W, N)`` (NaN allowed).
        max_lines: The most lines.

    Returns:
        Rank indices, ascending: with more ranks than ``max_lines``, ranks at evenly spaced
        positions of the order by mean value (the fastest and the slowest included).
    """
    num_ranks = median_ms.shape[1]
    if num_ranks <= max_lines:
        return list(range(num_ranks))
    with quiet_numpy():
        mean = np.nanmean(np.where(np.isfinite(median_ms), median_ms, np.nan), axis=0)
    order = np.argsort(np.nan_to_num(mean, nan=-np.inf), kind="stable")
    idx = np.unique(np.linspace(0, num_ranks - 1, max_lines).round().astype(int))
    return sorted(int(order[i]) for i in idx)


@contextlib.contextmanager
def quiet_numpy() -> Iterator[None]:
    """Silence numpy's warnings on all-NaN slices in a block."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield
