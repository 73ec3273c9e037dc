"""One record per observation window: to the loggers and to ``rex_decisions.jsonl``.

Every window gives, on rank 0, one JSON object: the plan per rank, each rank's median compute
time, the imbalance test's p-values and verdict, the decision with its predicted and measured
step time, the true global throughput, the samples dropped as unusable, and (on CUDA with
NVML) each rank's telemetry, whose ``throttled`` flag names the slow ranks that were power-
or thermally throttled. Every record carries the run's ``run_id`` (kept across resumes)
and a UTC ``time``, so that two runs writing to one directory stay apart; a resumed fit is a
run of its own whose records name the run it resumed (``resumed_from``).

:class:`DecisionLog` appends records to the JSONL file (training logs their scalars,
:func:`window_metrics`, to the Trainer's loggers at Lightning's own logging steps, and
prints :func:`decision_line` for every decision that is not a hold). A resumed run may come
back to a window whose record the interrupted run already wrote (its decision was saved in
the checkpoint before it was exchanged): the log skips a record whose ``run_id`` and
``window`` the file already holds. :meth:`DecisionLog.read` skips, counts and warns about
any line that is not a JSON record (a run killed while writing, two runs glued on one
line), so an old log never stops a report or a new fit.
"""

from __future__ import annotations

import datetime
import json
import math
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lightning_rex.core.decision import Decision
from lightning_rex.core.window import Window

__all__ = [
    "DECISION_CODES",
    "MAX_LINE_BYTES",
    "MAX_LOG_BYTES",
    "DecisionLog",
    "build_record",
    "decision_line",
    "pending_record",
    "skipped_lines_message",
    "stream_records",
    "window_metrics",
]

MAX_LOG_BYTES = 1 << 30
"""The largest decision log read back (1 GiB; a run writes about 1 KB a window)."""
MAX_LINE_BYTES = 1 << 20
"""The longest line read as a record (1 MiB); a longer one is skipped, read in chunks."""

DECISION_CODES = {"hold": 0, "propose": 1, "accept": 2, "rollback": 3, "recommend": 4, "skip": 5}


def _ms(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else 1000.0 * value


def _even_ms(value: Sequence[float] | None) -> list[float] | None:
    """The even split's estimated step, ``[mean, low, high]`` in ms, or None."""
    if value is None:
        return None
    out = [_ms(float(v)) for v in value]
    return None if any(v is None for v in out) else [float(v) for v in out if v is not None]


def build_record(
    window: Window,
    decision: Decision,
    info: dict[str, Any],
    *,
    kind: str,
    new_plan: Sequence[int] | None,
    effective_step: int | None,
    plan_changes: int,
    adaptive: bool,
    run_id: str,
    resumed_from: str | None = None,
) -> dict[str, Any]:
    """The JSON record of one window and the decision exchanged for it.

    Args:
        window: The observed window.
        decision: The decider's decision on it.
        info: The window's extras: ``telemetry`` (per rank, or None),
            ``global_samples_per_s``, ``window_samples``, ``window_wall_s``,
            ``dropped_samples``, ``warmup_steps`` (on a fresh fit's first window: the steps
            the warm-up lasted; None elsewhere), the decider's ``even_step_s`` estimate (or
            None) and, when training waited for the decision at a poll after its exchange,
            ``exchange_wait_s``.
        kind: The decision as applied: the decision's kind, or ``"recommend"`` for a
            proposal that monitor-only use did not apply.
        new_plan: The plan proposed (applied or recommended), or None.
        effective_step: The step the new plan took effect at, or None.
        plan_changes: Plan changes in the run's schedule as of this decision.
        adaptive: Whether plans are applied.
        run_id: The run's id.
        resumed_from: The run id of the checkpoint this run resumed, or None.

    Returns:
        The record.
    """
    sig = decision.significance or {}
    telemetry = info.get("telemetry")
    slow = list(sig.get("slow_ranks", []))
    measured, predicted = decision.measured_step_s, decision.predicted_step_s
    med = window.medians
    return {
        "run_id": run_id,
        "resumed_from": resumed_from,
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds"),
        "step": window.step_end,
        "window": [window.step_start, window.step_end],
        "plan": list(window.plan),
        "median_ms": (1000.0 * med).tolist(),
        "p_values": sig.get("p_values"),
        "alpha": sig.get("alpha"),
        "verdict": "imbalanced" if sig.get("imbalanced") else "balanced",
        "decision": kind,
        "validated": bool(decision.validated),
        "reason": decision.reason,
        "new_plan": None if new_plan is None else list(new_plan),
        "effective_step": effective_step,
        "predicted_step_ms": _ms(predicted),
        "measured_step_ms": _ms(measured),
        "predicted_speedup": (measured / predicted) if (measured and predicted) else None,
        "imbalance": float(med.max() / med.min() - 1.0),
        "global_samples_per_s": info.get("global_samples_per_s"),
        "window_samples": info.get("window_samples"),
        "window_wall_s": info.get("window_wall_s"),
        "dropped_samples": int(info.get("dropped_samples", 0)),
        "warmup_steps": info.get("warmup_steps"),
        "exchange_wait_ms": _ms(info.get("exchange_wait_s")),
        "even_step_ms": _even_ms(info.get("even_step_s")),
        "telemetry": telemetry,
        "throttled_slow_ranks": [
            r for r in slow if telemetry and (telemetry[r] or {}).get("throttled", False)
        ],
        "plan_changes": plan_changes,
        "adaptive": adaptive,
    }


def pending_record(
    e: Any,
    applied: Sequence[int] | None,
    effective: int | None,
    before: int,
    adaptive: bool,
    run_id: str,
    resumed_from: str | None,
    devices: Sequence[str] = (),
    note: str = "",
) -> dict[str, Any]:
    """The record of a queued window's decision, as the exchange applied it (or not).

    Args:
        e: The queued window (a :class:`~lightning_rex.driver.observer.Pending`) with its
            decision.
        applied: The plan the exchange applied, or None.
        effective: The step it took effect at, or None.
        before: Plan changes in the schedule before the exchange.
        adaptive: Whether plans are applied (a proposal otherwise is a ``recommend``).
        run_id: The run's id.
        resumed_from: The run id this fit resumed, or None.
        devices: Every rank's device identity (labels the report's legends), or empty.
        note: Appended to the decision's reason ("training ended before its exchange").

    Returns:
        The record (:func:`build_record`).
    """
    decision = e.outcome
    assert isinstance(decision, Decision)
    mine = applied is not None and decision.plan == tuple(applied)
    kind = "recommend" if (decision.kind == "propose" and not adaptive) else decision.kind
    record = build_record(
        e.window,
        decision,
        e.info,
        kind=kind,
        new_plan=decision.plan,
        effective_step=effective if mine else None,
        plan_changes=before + int(mine),
        adaptive=adaptive,
        run_id=run_id,
        resumed_from=resumed_from,
    )
    if note:
        record["reason"] = f"{record['reason']}; {note}"
    if len(devices) == len(record["plan"]):
        record["devices"] = list(devices)
    return record


def decision_line(record: dict[str, Any]) -> str | None:
    """One line for a person: what a record decided, to which plan, why, and its gain.

    Args:
        record: A window record (:func:`build_record`).

    Returns:
        The line, or None for a ``hold`` (nothing changes).
    """
    kind = record["decision"]
    if kind in ("hold", "skip"):
        return None
    plan, new = list(record["plan"]), record.get("new_plan")
    effective_step = record.get("effective_step")
    where = f" from step {effective_step}" if effective_step is not None else ""
    gain = record.get("predicted_speedup")
    if kind == "propose" and new is not None:
        what = f"new plan {list(new)}{where} (was {plan})"
    elif kind == "recommend" and new is not None:
        what = f"recommends plan {list(new)} (monitor-only; plan {plan} stays)"
    elif kind == "rollback" and new is not None:
        what = f"rolls back to {list(new)}{where} (from {plan})"
        gain = None
    elif kind == "accept":
        what = f"keeps plan {plan}"
        gain = None
    else:
        what = f"{kind} {plan}"
    if gain is not None and kind in ("propose", "recommend"):
        what += f", predicted {gain:.2f}x as fast"
    return f"lightning-rex step {record['step']}: {what}: {record['reason']}"


def window_metrics(record: dict[str, Any]) -> dict[str, float]:
    """Flatten a window record into scalar metrics for loggers.

    Args:
        record: A record as written to the JSONL file.

    Returns:
        Metric names (``rex/...``) to floats; missing values are left out.
    """
    out: dict[str, float] = {}
    for rank, size in enumerate(record["plan"]):
        out[f"rex/plan_rank{rank}"] = float(size)
    for rank, median in enumerate(record["median_ms"]):
        out[f"rex/median_ms_rank{rank}"] = float(median)
    for rank, p_value in enumerate(record["p_values"] or []):
        out[f"rex/p_value_rank{rank}"] = float(p_value)
    out["rex/imbalanced"] = float(record["verdict"] == "imbalanced")
    out["rex/decision"] = float(DECISION_CODES[record["decision"]])
    for key in (
        "predicted_step_ms",
        "measured_step_ms",
        "imbalance",
        "global_samples_per_s",
        "plan_changes",
        "predicted_speedup",
        "dropped_samples",
    ):
        if record.get(key) is not None:
            out[f"rex/{key}"] = float(record[key])
    return out


def _key(record: dict[str, Any]) -> tuple[str, int, int]:
    start, end = record["window"]
    return str(record.get("run_id")), int(start), int(end)


class DecisionLog:
    """Write window records to ``rex_decisions.jsonl`` (rank 0 only).

    Args:
        directory: The run's log directory; the JSONL file is created there.
        run_id: The run's id: records of this run already in the file are not written again.
    """

    def __init__(self, directory: str | Path, run_id: str) -> None:
        self.path = Path(directory) / "rex_decisions.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()
        self._written = {
            _key(r) for r in self.read(self.path) if r.get("run_id") == run_id and "window" in r
        }

    def _repair(self) -> None:
        """Cut a partial last line (a run stopped while writing it) before appending."""
        if not self.path.exists():
            return
        with self.path.open("rb+") as handle:
            end = handle.seek(0, 2)
            if end == 0:
                return
            handle.seek(end - 1)
            if handle.read(1) == b"\n":
                return
            pos = end  # find the last newline, reading backwards in chunks
            while pos > 0:
                start = max(0, pos - 65536)
                handle.seek(start)
                chunk = handle.read(pos - start)
                newline_at = chunk.rfind(b"\n")
                if newline_at >= 0:
                    pos = start + newline_at + 1
                    break
                pos = start
            handle.truncate(pos)
        warnings.warn(
            f"{self.path}: removing a partial last line (a run stopped while writing it)",
            stacklevel=3,
        )

    def write(self, record: dict[str, Any]) -> bool:
        """Append ``record``, unless the file holds it already.

        Args:
            record: The window record (JSON-able).

        Returns:
            Whether it was written (False for a window this run already logged).
        """
        key = _key(record)
        if key in self._written:
            return False
        self._written.add(key)
        with self.path.open("a") as handle:
            handle.write(json.dumps(record, default=_json_default) + "\n")
        return True

    @staticmethod
    def read(path: str | Path) -> list[dict[str, Any]]:
        """Read a decision log back, line by line.

        A line that is not a JSON record (two records glued by runs writing at once, a
        partial last line of a run killed while writing, a line over
        :data:`MAX_LINE_BYTES`) is skipped and counted, with one warning naming the lines;
        the records around it are kept. Memory stays bounded: lines are read one at a time,
        at most :data:`MAX_LINE_BYTES` at once.

        Args:
            path: The JSONL file (a missing file reads as empty).

        Returns:
            The records (JSON objects) in order.
        """
        log_path = Path(path)
        if not log_path.exists():
            return []
        bad: list[int] = []
        out = [rec for _, rec in stream_records(log_path, bad)]
        if bad:
            warnings.warn(skipped_lines_message(log_path, bad), stacklevel=2)
        return out


def stream_records(path: Path, bad: list[int]) -> Iterator[tuple[int, dict[str, Any]]]:
    """A decision log's records one at a time, as :meth:`DecisionLog.read` reads them.

    Only one line (at most :data:`MAX_LINE_BYTES`) is held at a time, so a caller that keeps
    less than every record (the prior's sums per device) reads a long log in bounded memory.

    Args:
        path: The JSONL file (it must exist).
        bad: Receives the numbers of the lines skipped as not JSON records.

    Yields:
        ``(line number, record)`` for every JSON object, in order.

    Raises:
        ValueError: For a path that is not a regular file, or one over :data:`MAX_LOG_BYTES`.
    """
    if not path.is_file():  # a FIFO would block, a device (/dev/zero) never ends
        raise ValueError(f"{path}: not a regular file")
    size = path.stat().st_size
    if size > MAX_LOG_BYTES:
        raise ValueError(
            f"{path}: {size:,} bytes; a decision log is read up to {MAX_LOG_BYTES:,} bytes"
        )
    with path.open("rb") as handle:
        line_number = 0
        while True:
            raw = handle.readline(MAX_LINE_BYTES + 1)
            if not raw:
                break
            line_number += 1
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while raw and not raw.endswith(b"\n"):  # skip the rest, a chunk at a time
                    raw = handle.readline(MAX_LINE_BYTES)
                bad.append(line_number)
                continue
            line = raw.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except (UnicodeDecodeError, RecursionError, ValueError):  # JSONDecodeError too
                rec = None
            if isinstance(rec, dict):
                yield line_number, rec
            else:
                bad.append(line_number)


def skipped_lines_message(path: Path, bad: Sequence[int]) -> str:
    """The warning for the lines :func:`stream_records` skipped.

    Args:
        path: The decision log.
        bad: The numbers of the lines skipped.

    Returns:
        One sentence naming the first five lines and the likely causes.
    """
    shown = ", ".join(str(i) for i in bad[:5]) + (", ..." if len(bad) > 5 else "")
    return (
        f"{path}: skipped {len(bad)} line(s) that are not JSON records (line {shown}):"
        " a partial last line of a run stopped while writing, or records of runs that"
        " wrote at once"
    )


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
