"""One record per observation window: to the Trainer's loggers and to ``rex_decisions.jsonl``.

Every window logs, on rank 0, the plan per rank, each rank's median compute time, the
imbalance test's p-values and verdict, the decision with its predicted and measured step
time, the true global throughput, and (on CUDA with NVML) each rank's telemetry. The JSONL
file lives in the run's log directory and holds one JSON object per window with the keys
``step``, ``plan``, ``median_ms``, ``p_values``, ``verdict``, ``decision``,
``predicted_step_ms``, ``measured_step_ms`` and ``telemetry`` (plus a few more).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lightning_rex.core.window import Window
from lightning_rex.measure.telemetry import throttled

__all__ = ["DECISION_CODES", "DecisionLog", "build_record", "decision_payload", "window_metrics"]

DECISION_CODES = {"hold": 0, "propose": 1, "accept": 2, "rollback": 3, "recommend": 4}


def _ms(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else 1000.0 * value


def decision_payload(decision: dict[str, Any], window: Window, adaptive: bool) -> dict[str, Any]:
    """Rank 0's view of a decision: what to apply, what to record, the summary to show.

    Args:
        decision: ``Decision.to_dict()``.
        window: The window it was made on.
        adaptive: Whether plans are applied; otherwise a proposal becomes a ``recommend``
            (monitor-only), with its plan under ``recommended``.

    Returns:
        ``kind``, ``plan`` (to apply, or None), ``recommended``, ``decision`` and
        ``imbalance`` (the window's max/min median ratio minus one).
    """
    med = window.medians
    plan, kind = decision["plan"], decision["kind"]
    recommend = plan is not None and not adaptive
    return {
        "kind": "recommend" if recommend else kind,
        "plan": None if recommend else plan,
        "recommended": plan if recommend else None,
        "decision": decision,
        "imbalance": float(med.max() / med.min() - 1.0),
    }


def build_record(
    window: Window, payload: dict[str, Any], info: dict[str, Any], effective_step: int | None
) -> dict[str, Any]:
    """The JSON record of one window and the decision exchanged for it.

    Args:
        window: The observed window.
        payload: What rank 0 broadcast: ``kind``, ``plan``, ``recommended``, ``imbalance`` and
            the controller's ``decision`` as a dictionary.
        info: The window's extras: ``telemetry`` (per rank, or None), ``global_samples_per_s``,
            ``window_samples`` and ``window_wall_s``.
        effective_step: The step the new plan took effect at, or None.

    Returns:
        The record, without the run-level fields (``plan_changes``, ``adaptive``).
    """
    d = payload["decision"]
    sig = d["significance"] or {}
    telemetry = info.get("telemetry")
    slow = list(sig.get("slow_ranks", []))
    measured, predicted = d["measured_step_s"], d["predicted_step_s"]
    return {
        "step": window.step_end,
        "window": [window.step_start, window.step_end],
        "plan": list(window.plan),
        "median_ms": (1000.0 * window.medians).tolist(),
        "p_values": sig.get("p_values"),
        "verdict": "imbalanced" if sig.get("imbalanced") else "balanced",
        "decision": payload["kind"],
        "validated": bool(d.get("validated", False)),
        "reason": d["reason"],
        "new_plan": payload["plan"] or payload["recommended"],
        "effective_step": effective_step,
        "predicted_step_ms": _ms(predicted),
        "measured_step_ms": _ms(measured),
        "predicted_speedup": (measured / predicted) if (measured and predicted) else None,
        "imbalance": payload["imbalance"],
        "global_samples_per_s": info.get("global_samples_per_s"),
        "window_samples": info.get("window_samples"),
        "window_wall_s": info.get("window_wall_s"),
        "telemetry": telemetry,
        "throttled_slow_ranks": [r for r in slow if telemetry and throttled(telemetry[r])],
    }


def window_metrics(record: dict[str, Any]) -> dict[str, float]:
    """Flatten a window record into scalar metrics for Lightning loggers.

    Args:
        record: A record as written to the JSONL file.

    Returns:
        Metric names (``rex/...``) to floats; missing values are left out.
    """
    out: dict[str, float] = {}
    for r, b in enumerate(record["plan"]):
        out[f"rex/plan_rank{r}"] = float(b)
    for r, m in enumerate(record["median_ms"]):
        out[f"rex/median_ms_rank{r}"] = float(m)
    for r, p in enumerate(record["p_values"] or []):
        out[f"rex/p_value_rank{r}"] = float(p)
    out["rex/imbalanced"] = float(record["verdict"] == "imbalanced")
    out["rex/decision"] = float(DECISION_CODES[record["decision"]])
    for key in (
        "predicted_step_ms",
        "measured_step_ms",
        "imbalance",
        "global_samples_per_s",
        "plan_changes",
        "predicted_speedup",
    ):
        if record.get(key) is not None:
            out[f"rex/{key}"] = float(record[key])
    return out


class DecisionLog:
    """Write window records to the loggers and to ``rex_decisions.jsonl`` (rank 0 only).

    Args:
        directory: The run's log directory; the JSONL file is created there.
        loggers: The Trainer's loggers.
    """

    def __init__(self, directory: str | Path, loggers: list[Any]) -> None:
        self.path = Path(directory) / "rex_decisions.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.loggers = loggers

    def write(self, record: dict[str, Any], step: int) -> None:
        """Append ``record`` to the file and log its scalars at ``step``.

        Args:
            record: The window record (JSON-able).
            step: The logger step (``trainer.global_step``).
        """
        with self.path.open("a") as fh:
            fh.write(json.dumps(record, default=_json_default) + "\n")
        metrics = window_metrics(record)
        for logger in self.loggers:
            logger.log_metrics(metrics, step=step)

    @staticmethod
    def read(path: str | Path) -> list[dict[str, Any]]:
        """Read a decision log back.

        Args:
            path: The JSONL file.

        Returns:
            The records in order.
        """
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
