"""A controller's saved state, checked field by field before anything is loaded.

:func:`check_controller_state` checks a ``Controller.state_dict`` (possibly through JSON)
against the run's ``B`` and ``N`` and normalises it, so that every rank can check a
checkpoint (only rank 0 holds a controller) and
:meth:`ControllerState.from_checked
<lightning_rex.core.decide.controller_state.ControllerState.from_checked>` can restore it.
"""

from __future__ import annotations

from typing import Any

from lightning_rex.core.model.time_model import RankTimeModel
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.saved import (
    StateError,
    flag,
    float_list,
    int_list,
    matrix,
    optional,
    real,
    whole,
)
from lightning_rex.core.saved import field as state_field

__all__ = ["check_controller_state"]


def check_controller_state(
    d: Any, global_batch: int, world_size: int, name: str = "controller"
) -> dict[str, Any]:
    """Check saved controller state against the run's ``B`` and ``N`` without loading it.

    Args:
        d: A dictionary from ``Controller.state_dict``, possibly through JSON.
        global_batch: This run's global batch ``B``.
        world_size: This run's number of ranks ``N``.
        name: The dotted name of ``d``, for errors.

    Returns:
        The state, normalised to plain Python types.

    Raises:
        StateError: Naming the first field that is missing or breaks an invariant.
    """
    # with global batch scaling the controller may run at another B than the run's first
    if not isinstance(d, dict):
        raise StateError(name, f"must be a mapping, got {type(d).__name__}")
    if "global_batch" in d:
        global_batch = whole(d["global_batch"], f"{name}.global_batch", world_size)

    def plan(key: str) -> Plan | None:
        sizes = optional(state_field(d, key, name), int_list, f"{name}.{key}", world_size, 1)
        if sizes is not None and sum(sizes) != global_batch:
            raise StateError(
                f"{name}.{key}", f"must sum to the global batch B={global_batch}, got {sum(sizes)}"
            )
        return None if sizes is None else tuple(sizes)

    state = state_field(d, "state", name)
    if state not in ("steady", "validating", "rolling_back"):
        raise StateError(f"{name}.state", f"must be steady, validating or rolling_back: {state!r}")
    out: dict[str, Any] = {"state": state, "plan": plan("plan")}
    for key in ("pending", "previous"):
        out[key] = plan(key)
    out["rejected"] = plan("rejected") if "rejected" in d else None
    if state == "validating" and (out["pending"] is None or out["previous"] is None):
        raise StateError(f"{name}.pending", "and previous must be plans while validating")
    out["predicted"] = optional(state_field(d, "predicted", name), real, f"{name}.predicted", True)
    out["baseline"] = optional(
        state_field(d, "baseline", name), float_list, f"{name}.baseline", None, True
    )
    recent = state_field(d, "recent", name)
    if not isinstance(recent, list):
        raise StateError(f"{name}.recent", "must be a list of windows")
    out["recent"] = [
        matrix(w, f"{name}.recent[{i}]", world_size, None, True) for i, w in enumerate(recent)
    ]
    out["fitted_at"] = whole(state_field(d, "fitted_at", name), f"{name}.fitted_at", -1)
    out["refit_wanted"] = flag(d.get("refit_wanted", False), f"{name}.refit_wanted")
    out["reference"] = optional(
        state_field(d, "reference", name), float_list, f"{name}.reference", world_size, True
    )
    out["windows_seen"] = whole(state_field(d, "windows_seen", name), f"{name}.windows_seen", 0)
    # windows differ in length (the driver drops unusable steps): each row checked alone
    out["before"] = _rows(d.get("before", []), f"{name}.before")
    out["changed"] = flag(d.get("changed", False), f"{name}.changed")
    out["trial"] = _rows(d.get("trial", []), f"{name}.trial")
    out["rolled_back"] = flag(d.get("rolled_back", False), f"{name}.rolled_back")
    out["guess"] = flag(d.get("guess", False), f"{name}.guess")
    out["shape_cost_s"] = real(d.get("shape_cost_s", 0.0), f"{name}.shape_cost_s")
    if out["shape_cost_s"] < 0:
        raise StateError(f"{name}.shape_cost_s", f"must be seconds >= 0, got {out['shape_cost_s']}")
    floors = d.get("floors", [])
    out["floors"] = matrix(floors, f"{name}.floors", None, 3) if floors else []
    for index, (rank, size, seconds) in enumerate(out["floors"]):
        if (
            int(rank) != rank
            or not 0 <= rank < world_size
            or int(size) != size
            or size < 1
            or seconds <= 0
        ):
            raise StateError(
                f"{name}.floors[{index}]",
                f"must be [rank, size >= 1, seconds > 0], got {[rank, size, seconds]}",
            )
    segs = d.get("segments", [])
    if not isinstance(segs, list):
        raise StateError(f"{name}.segments", "must be a list of the window's segments")
    for index, seg in enumerate(segs):
        where = f"{name}.segments[{index}]"
        matrix(state_field(seg, "times", where), f"{where}.times", world_size, None, True)
        sizes = int_list(state_field(seg, "plan", where), f"{where}.plan", world_size, 1)
        if sum(sizes) != global_batch:
            raise StateError(
                f"{where}.plan", f"must sum to the global batch B={global_batch}, got {sum(sizes)}"
            )
        first = whole(state_field(seg, "start", where), f"{where}.start", 0)
        whole(state_field(seg, "end", where), f"{where}.end", first + 1)
    hist = d.get("history", {"z": [], "plans": []})  # absent from checkpoints before it existed
    if not isinstance(hist, dict):
        raise StateError(f"{name}.history", "must be a mapping")
    plans = state_field(hist, "plans", f"{name}.history")
    if not isinstance(plans, list):
        raise StateError(f"{name}.history.plans", "must be a list of plans and lengths")
    out["history"] = {
        "z": matrix(
            state_field(hist, "z", f"{name}.history"), f"{name}.history.z", len(plans), world_size
        ),
        "plans": [  # each: the window's plan, then its length
            int_list(p, f"{name}.history.plans[{i}]", world_size + 1, 0)
            for i, p in enumerate(plans)
        ],
    }
    # every rank gets at least min_size samples of B
    out["min_size"] = whole(
        state_field(d, "min_size", name), f"{name}.min_size", 1, max(1, global_batch // world_size)
    )
    caps = state_field(d, "max_sizes", name)
    if caps is not None:
        caps = _caps(caps, f"{name}.max_sizes", world_size)
    out["max_sizes"] = caps
    out["model"] = RankTimeModel.check_state(
        state_field(d, "model", name), world_size, f"{name}.model"
    )
    return out


def _rows(v: Any, name: str) -> list[list[float]]:
    if not isinstance(v, list):
        raise StateError(name, "must be a list of windows' per-step times")
    return [float_list(r, f"{name}[{i}]", None, True) for i, r in enumerate(v)]


def _caps(v: Any, name: str, world_size: int) -> list[int | None]:
    if not isinstance(v, list) or len(v) != world_size:
        raise StateError(name, f"must be a list of {world_size} caps (null for none)")
    return [None if c is None else whole(c, f"{name}[{i}]", 1) for i, c in enumerate(v)]
