"""The window driver's checkpoint state: its layout, its checks, and resuming elsewhere.

The state is plain JSON-able data (``version`` 2)::

    {"version", "run_id", "world_size", "global_batch",
     "skip_until", "exchange_at", "steps", "window_plan", "partial",   # the window so far
     "pending",                                                         # decisions not exchanged
     "dropped", "first_look", "warm_until", "fit_start",               # a fit's start
     "controller", "device_rates"}

:func:`check_state` checks every field against the run before anything is restored: a
partial window with one row of the same length per rank, steps in order, a window plan
that sums to ``B``, pending decisions with their windows, and (through the decider's own
check) the controller state. It is pure, so every rank runs it on the same checkpoint and
fails alike, before any step. A checkpoint from another world size keeps only ``run_id``
and ``device_rates``: fitted rates keyed by device identity, from which
:func:`~lightning_rex.core.plans.minimax.plan_from_device_rates` plans the new ranks; so does
one whose loader position was re-cut at this run's global batch (the plan target says so),
and a saved world size or global batch that disagrees with the loader's position of the
same checkpoint is an error.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lightning_rex.core.decision import Decision
from lightning_rex.core.plans.minimax import device_rates
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.saved import (
    StateError,
    field,
    flag,
    int_list,
    optional,
    real,
    whole,
)
from lightning_rex.core.window import Window
from lightning_rex.driver.gathering import Gathering
from lightning_rex.driver.observer import BackgroundObserver, Pending
from lightning_rex.driver.protocols import Resumed

__all__ = [
    "STATE_VERSION",
    "check_state",
    "loop_state",
    "pending_from_state",
    "pending_to_state",
]

STATE_VERSION = 2
_INFO_KEYS = (
    "global_samples_per_s",
    "window_samples",
    "window_wall_s",
    "dropped_samples",
    "warmup_steps",
)


def loop_state(
    *,
    run_id: str,
    schedule: PlanSchedule,
    gathering: Gathering,
    exchange_at: int | None,
    partial: np.ndarray,
    pending: list[dict[str, Any]],
    dropped: int,
    controller: Any,
    rates: dict[str, list[float]],
) -> dict[str, Any]:
    """The window loop's checkpoint state, assembled (the module docstring's fields).

    Args:
        run_id: The fit's run id.
        schedule: The plan schedule (its world size and base global batch are saved).
        gathering: The partial window: its steps and plan, the first step measured after a
            plan change, whether the fit's first look is still to come, and the warm-up
            still going on (:meth:`Gathering.restore
            <lightning_rex.driver.gathering.Gathering.restore>` reads them back).
        exchange_at: The step of the next exchange, or None.
        partial: Every rank's step times of the partial window (NaN where unread).
        pending: The decisions not yet exchanged (:func:`pending_to_state`).
        dropped: Samples dropped so far.
        controller: The decider's state (rank 0), or None.
        rates: Fitted rates per device identity.

    Returns:
        JSON-able data.
    """
    return {
        "version": STATE_VERSION,
        "run_id": run_id,
        "world_size": schedule.world_size,
        "global_batch": schedule.global_batch,
        "skip_until": gathering.skip_until,
        "exchange_at": exchange_at,
        "steps": list(gathering.steps),
        "window_plan": None if gathering.plan is None else list(gathering.plan),
        "partial": [[None if not np.isfinite(x) else float(x) for x in r] for r in partial],
        "pending": pending,
        "dropped": dropped,
        "first_look": gathering.first_look,
        "warm_until": gathering.warm_until,
        "fit_start": gathering.fit_start,
        "controller": controller,
        "device_rates": rates,
    }


def decider_state(
    observer: BackgroundObserver, device_keys: Sequence[str]
) -> tuple[list[dict[str, Any]], Any, dict[str, list[float]]]:
    """Rank 0 at a checkpoint: wait for the decider's work, then what of it is saved.

    Args:
        observer: The background observer (and its decider).
        device_keys: Every rank's device identity.

    Returns:
        The decisions not yet exchanged (:func:`pending_to_state`), the decider's state,
        and its fitted rates per device identity.

    Raises:
        BaseException: A decision's own error, when one failed.
    """
    entries = observer.drain()
    for entry in entries:
        if isinstance(entry.outcome, BaseException):
            raise entry.outcome
    decider = observer.decider
    rates = device_rates(list(device_keys), decider.rank_model_summary())
    return [pending_to_state(e) for e in entries], decider.state_dict(), rates


def pending_to_state(entry: Pending) -> dict[str, Any]:
    """A queued window and its decision as JSON-able data (telemetry is not kept).

    Args:
        entry: An entry whose outcome is a decision.

    Returns:
        ``{"window": {...}, "info": {...}, "decision": {...}}``.
    """
    assert isinstance(entry.outcome, Decision)
    window = entry.window
    return {
        "window": {
            "times": window.times.tolist(),
            "plan": list(window.plan),
            "start": window.step_start,
            "end": window.step_end,
        },
        "info": {k: entry.info.get(k) for k in (*_INFO_KEYS, "even_step_s")},
        "decision": entry.outcome.to_dict(),
    }


def _check_plan(
    plan: Any, global_batch: int, bounds: SizeBounds, batch_range: tuple[int, int] | None
) -> Plan:
    """A saved plan checked like the schedule checks it (any ``B`` of the range, if any)."""
    if batch_range is not None:
        total = sum(int(b) for b in plan)
        if not batch_range[0] <= total <= batch_range[1]:
            raise ValueError(f"plan sums to {total}, outside the global batch range {batch_range}")
        global_batch = total
    return bounds.check(plan, global_batch, "plan")


def pending_from_state(
    d: Any,
    name: str,
    world_size: int,
    global_batch: int,
    bounds: SizeBounds,
    batch_range: tuple[int, int] | None = None,
) -> Pending:
    """Rebuild a queued entry, checking it (its plan as strictly as any plan).

    Args:
        d: A dictionary from :func:`pending_to_state`.
        name: Its dotted name, for errors.
        world_size: The number of ranks.
        global_batch: The global batch ``B``.
        bounds: The size bounds.
        batch_range: The range of ``B`` under global batch scaling, or None.

    Returns:
        The entry, ready to be exchanged.

    Raises:
        StateError: Naming the field.
    """
    saved_window = field(d, "window", name)
    plan = int_list(
        field(saved_window, "plan", f"{name}.window"), f"{name}.window.plan", world_size, 1
    )
    try:
        window = Window(
            np.asarray(field(saved_window, "times", f"{name}.window"), dtype=np.float64),
            tuple(plan),
            whole(field(saved_window, "start", f"{name}.window"), f"{name}.window.start", 0),
            whole(field(saved_window, "end", f"{name}.window"), f"{name}.window.end", 1),
        )
    except (ValueError, TypeError) as err:
        raise StateError(f"{name}.window", str(err)) from None
    info = field(d, "info", name)
    if not isinstance(info, dict):
        raise StateError(f"{name}.info", "must be a mapping")
    clean: dict[str, Any] = {"telemetry": None}
    for key in _INFO_KEYS:
        value = info.get(key)
        if value is not None and real(value, f"{name}.info.{key}") < 0:
            raise StateError(f"{name}.info.{key}", f"must be a number >= 0 or null, got {value!r}")
        clean[key] = value
    clean["dropped_samples"] = (
        optional(clean["dropped_samples"], whole, f"{name}.info.dropped_samples", 0) or 0
    )
    clean["warmup_steps"] = optional(clean["warmup_steps"], whole, f"{name}.info.warmup_steps", 0)
    even = info.get("even_step_s")
    if even is not None:
        if not (isinstance(even, (list, tuple)) and len(even) == 3):
            raise StateError(f"{name}.info.even_step_s", f"must be 3 numbers or null, got {even!r}")
        clean["even_step_s"] = [real(v, f"{name}.info.even_step_s") for v in even]
    decision = Decision.from_dict(field(d, "decision", name), f"{name}.decision")
    if decision.plan is not None:
        if len(decision.plan) != world_size:
            raise StateError(
                f"{name}.decision.plan", f"must have {world_size} entries, got {len(decision.plan)}"
            )
        try:
            _check_plan(decision.plan, global_batch, bounds, batch_range)
        except ValueError as err:
            raise StateError(f"{name}.decision.plan", str(err)) from None
        if decision.kind not in ("propose", "rollback"):
            raise StateError(f"{name}.decision.plan", f"must be null for a {decision.kind}")
    return Pending(window, clean, decision)


def check_state(
    s: Any,
    world_size: int,
    global_batch: int,
    bounds: SizeBounds,
    check_decider: Callable[[Any, int, int], Any] | None = None,
    batch_range: tuple[int, int] | None = None,
    resumed: Resumed | None = None,
    step: int | None = None,
    horizon: int = 0,
) -> dict[str, Any]:
    """Check a driver state against this run, before anything is restored.

    Args:
        s: The state from a checkpoint.
        world_size: This run's number of ranks.
        global_batch: This run's global batch ``B``.
        bounds: This run's size bounds.
        check_decider: Checks the decider's state and returns it, or None when it is a
            decider of another kind that this run starts afresh
            (``Controller.check_state``); None: the state is kept unchecked.
        batch_range: The range of ``B`` under global batch scaling, or None.
        resumed: How the plan target restored its schedule from the same checkpoint: the
            loop continues exactly when the schedule does, and starts afresh when the
            schedule was re-cut. None: the target has no checkpoint of its own.
        step: The step the resumed fit starts at; saved steps ahead of it (the next
            exchange, the first measured step) may be at most ``horizon`` steps later.
        horizon: See ``step``.

    Returns:
        The state, normalised; ``continues`` says whether the loop continues it (otherwise
        only ``run_id`` and ``device_rates`` are kept).

    Raises:
        StateError: Naming the first field that is missing or breaks an invariant, or that
            disagrees with the loader's position saved in the same checkpoint.
    """
    name = "rex_driver"
    version = whole(field(s, "version", name), f"{name}.version")
    if version != STATE_VERSION:
        raise StateError(f"{name}.version", f"must be {STATE_VERSION}, got {version}")
    run_id = field(s, "run_id", name)
    if not isinstance(run_id, str) or not run_id.isalnum() or len(run_id) > 64:
        raise StateError(f"{name}.run_id", f"must be a short alphanumeric id, got {run_id!r}")
    out: dict[str, Any] = {
        "run_id": run_id,
        "device_rates": _rates(field(s, "device_rates", name), f"{name}.device_rates"),
    }
    saved_world = whole(field(s, "world_size", name), f"{name}.world_size", 1)
    saved_batch = whole(field(s, "global_batch", name), f"{name}.global_batch", saved_world)
    same = saved_world == world_size and saved_batch == global_batch
    if resumed is not None and resumed.continues and not same:
        what, got, want = (
            ("world_size", saved_world, world_size)
            if saved_world != world_size
            else ("global_batch", saved_batch, global_batch)
        )
        raise StateError(
            f"{name}.{what}",
            f"is {got}, but the loader's position in the same checkpoint was saved with "
            f"{want}: the checkpoint's entries disagree",
        )
    out["continues"] = same and (resumed is None or resumed.continues)
    if not out["continues"]:
        return out
    ahead = None if step is None else step + horizon
    out["skip_until"] = whole(field(s, "skip_until", name), f"{name}.skip_until", 0, ahead)
    out["exchange_at"] = optional(
        field(s, "exchange_at", name), whole, f"{name}.exchange_at", 0, ahead
    )
    steps = int_list(field(s, "steps", name), f"{name}.steps", None, 0)
    if any(b2 <= a for a, b2 in itertools.pairwise(steps)):
        raise StateError(f"{name}.steps", f"must be in increasing step order, got {steps}")
    if steps and step is not None and steps[-1] > step:
        raise StateError(
            f"{name}.steps", f"must be steps before the resumed step {step}, got {steps[-1]}"
        )
    out["steps"] = steps
    plan = optional(field(s, "window_plan", name), int_list, f"{name}.window_plan", saved_world, 1)
    if steps and plan is None:
        raise StateError(f"{name}.window_plan", "must be a plan while the window holds steps")
    if plan is not None:
        try:
            plan = _check_plan(plan, global_batch, bounds, batch_range)
        except ValueError as err:
            raise StateError(f"{name}.window_plan", str(err)) from None
    out["window_plan"] = plan
    out["partial"] = _rows(field(s, "partial", name), f"{name}.partial", saved_world, len(steps))
    pend = field(s, "pending", name)
    if not isinstance(pend, list):
        raise StateError(f"{name}.pending", "must be a list")
    out["pending"] = [
        pending_from_state(
            p, f"{name}.pending[{i}]", saved_world, global_batch, bounds, batch_range
        )
        for i, p in enumerate(pend)
    ]
    out["dropped"] = whole(field(s, "dropped", name), f"{name}.dropped", 0)
    # absent from checkpoints written before the first look existed: nothing left to do early
    out["first_look"] = flag(s.get("first_look", False), f"{name}.first_look")
    # absent from checkpoints written before the adaptive warm-up: it has ended
    out["warm_until"] = optional(s.get("warm_until"), whole, f"{name}.warm_until", 0)
    out["fit_start"] = optional(s.get("fit_start"), whole, f"{name}.fit_start", 0, step)
    ctl = field(s, "controller", name)
    if ctl is not None and check_decider is not None:
        ctl = check_decider(ctl, global_batch, world_size)
    out["controller"] = ctl
    return out


def _rows(v: Any, name: str, rows: int, cols: int) -> list[list[float]]:
    """Per-rank partial windows: ``rows`` lists of ``cols`` samples (None for a bad sample)."""
    if not isinstance(v, list) or len(v) != rows:
        raise StateError(name, f"must hold one row per rank ({rows}), got {_len(v)}")
    out = []
    for row_index, row in enumerate(v):
        if not isinstance(row, list) or len(row) != cols:
            raise StateError(
                f"{name}[{row_index}]",
                f"must hold one sample per step of the window ({cols}), got {_len(row)}",
            )
        vals = []
        for col_index, sample in enumerate(row):
            if sample is None:  # a sample that could not be read: dropped with its step
                vals.append(math.nan)
            else:
                vals.append(real(sample, f"{name}[{row_index}][{col_index}]", positive=True))
        out.append(vals)
    return out


def _len(v: Any) -> str:
    return f"{len(v)} entries" if isinstance(v, list) else type(v).__name__


def _rates(v: Any, name: str) -> dict[str, list[float]]:
    if not isinstance(v, dict):
        raise StateError(name, "must be a mapping of device to [rate, overhead]")
    out = {}
    for device, pair in v.items():
        if not isinstance(pair, list) or len(pair) != 2:
            raise StateError(f"{name}[{device!r}]", "must be [rate, overhead]")
        rate = real(pair[0], f"{name}[{device!r}][0]", positive=True)
        over = real(pair[1], f"{name}[{device!r}][1]")
        if over < 0:
            raise StateError(f"{name}[{device!r}][1]", f"must be an overhead >= 0, got {over}")
        out[str(device)] = [rate, over]
    return out
