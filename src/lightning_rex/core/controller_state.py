"""Checking a saved :class:`~lightning_rex.core.controller.Controller` state, field by field."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_rex.core.model import RankTimeModel
from lightning_rex.core.plan import Plan
from lightning_rex.core.state import (
    StateError,
    field,
    flag,
    float_list,
    int_list,
    matrix,
    optional,
    real,
    whole,
)

if TYPE_CHECKING:
    from lightning_rex.core.controller import Controller

__all__ = ["check_controller_state", "controller_state_dict", "load_controller_state"]


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
        v = optional(field(d, key, name), int_list, f"{name}.{key}", world_size, 1)
        if v is not None and sum(v) != global_batch:
            raise StateError(
                f"{name}.{key}", f"must sum to the global batch B={global_batch}, got {sum(v)}"
            )
        return None if v is None else tuple(v)

    state = field(d, "state", name)
    if state not in ("steady", "validating", "rolling_back"):
        raise StateError(f"{name}.state", f"must be steady, validating or rolling_back: {state!r}")
    out: dict[str, Any] = {"state": state, "plan": plan("plan")}
    for key in ("pending", "previous"):
        out[key] = plan(key)
    out["rejected"] = plan("rejected") if "rejected" in d else None
    if state == "validating" and (out["pending"] is None or out["previous"] is None):
        raise StateError(f"{name}.pending", "and previous must be plans while validating")
    out["predicted"] = optional(field(d, "predicted", name), real, f"{name}.predicted", True)
    out["baseline"] = optional(
        field(d, "baseline", name), float_list, f"{name}.baseline", None, True
    )
    recent = field(d, "recent", name)
    if not isinstance(recent, list):
        raise StateError(f"{name}.recent", "must be a list of windows")
    out["recent"] = [
        matrix(w, f"{name}.recent[{i}]", world_size, None, True) for i, w in enumerate(recent)
    ]
    out["fitted_at"] = whole(field(d, "fitted_at", name), f"{name}.fitted_at", -1)
    out["reference"] = optional(
        field(d, "reference", name), float_list, f"{name}.reference", world_size, True
    )
    out["windows_seen"] = whole(field(d, "windows_seen", name), f"{name}.windows_seen", 0)
    # windows differ in length (the driver drops unusable steps): each row checked alone
    out["before"] = _rows(d.get("before", []), f"{name}.before")
    out["changed"] = flag(d.get("changed", False), f"{name}.changed")
    out["trial"] = _rows(d.get("trial", []), f"{name}.trial")
    out["rolled_back"] = flag(d.get("rolled_back", False), f"{name}.rolled_back")
    segs = d.get("segments", [])
    if not isinstance(segs, list):
        raise StateError(f"{name}.segments", "must be a list of the window's segments")
    for i, seg in enumerate(segs):
        where = f"{name}.segments[{i}]"
        matrix(field(seg, "times", where), f"{where}.times", world_size, None, True)
        sizes = int_list(field(seg, "plan", where), f"{where}.plan", world_size, 1)
        if sum(sizes) != global_batch:
            raise StateError(
                f"{where}.plan", f"must sum to the global batch B={global_batch}, got {sum(sizes)}"
            )
        first = whole(field(seg, "start", where), f"{where}.start", 0)
        whole(field(seg, "end", where), f"{where}.end", first + 1)
    hist = d.get("history", {"z": [], "plans": []})  # absent from checkpoints before it existed
    if not isinstance(hist, dict):
        raise StateError(f"{name}.history", "must be a mapping")
    plans = field(hist, "plans", f"{name}.history")
    if not isinstance(plans, list):
        raise StateError(f"{name}.history.plans", "must be a list of plans and lengths")
    out["history"] = {
        "z": matrix(
            field(hist, "z", f"{name}.history"), f"{name}.history.z", len(plans), world_size
        ),
        "plans": [  # each: the window's plan, then its length
            int_list(p, f"{name}.history.plans[{i}]", world_size + 1, 0)
            for i, p in enumerate(plans)
        ],
    }
    # every rank gets at least min_size samples of B
    out["min_size"] = whole(
        field(d, "min_size", name), f"{name}.min_size", 1, max(1, global_batch // world_size)
    )
    caps = field(d, "max_sizes", name)
    if caps is not None:
        caps = _caps(caps, f"{name}.max_sizes", world_size)
    out["max_sizes"] = caps
    out["model"] = RankTimeModel.check_state(field(d, "model", name), world_size, f"{name}.model")
    return out


def _rows(v: Any, name: str) -> list[list[float]]:
    if not isinstance(v, list):
        raise StateError(name, "must be a list of windows' per-step times")
    return [float_list(r, f"{name}[{i}]", None, True) for i, r in enumerate(v)]


def _caps(v: Any, name: str, world_size: int) -> list[int | None]:
    if not isinstance(v, list) or len(v) != world_size:
        raise StateError(name, f"must be a list of {world_size} caps (null for none)")
    return [None if c is None else whole(c, f"{name}[{i}]", 1) for i, c in enumerate(v)]


# The controller's state round trip lives here, next to its check: this module is the
# controller's own (it reads and writes the controller's private fields by design).
def controller_state_dict(c: Controller) -> dict[str, Any]:
    """A controller's full state as JSON-able data (``Controller.state_dict``).

    Args:
        c: The controller.

    Returns:
        The state (configuration is not included).
    """
    return {
        "global_batch": c.global_batch,
        "plan": list(c._plan),
        "state": c._state,
        "pending": None if c._pending is None else list(c._pending),
        "previous": None if c._previous is None else list(c._previous),
        "rejected": None if c._rejected is None else list(c._rejected),
        "predicted": c._predicted,
        "baseline": c._baseline,
        "recent": c._recent,
        "fitted_at": c._fitted_at,
        "reference": c._reference,
        "windows_seen": c.windows_seen,
        "history": c._history.state_dict(),
        "before": c._before,
        "trial": c._trial,
        "rolled_back": c._rolled_back,
        "changed": c._changed,
        "segments": [] if c._segments is None else c._segments.state_dict(),
        "min_size": c.min_size,
        "max_sizes": c.max_sizes,
        "model": c.model.state_dict(),
    }


def load_controller_state(ctl: Controller, d: dict[str, Any]) -> None:
    """Restore ``Controller.state_dict`` output into ``ctl`` (``Controller.load_state_dict``).

    Args:
        ctl: A controller built with the same arguments.
        d: The saved state (possibly through a JSON round trip).

    Raises:
        StateError: Naming the field, when the state does not fit the controller.
    """
    s = check_controller_state(d, ctl.global_batch, ctl.world_size)
    ctl.global_batch = sum(s["plan"])
    try:
        ctl.set_bounds(s["min_size"], s["max_sizes"])
    except ValueError as err:
        raise StateError("controller.max_sizes", str(err)) from None
    ctl._plan = s["plan"]
    ctl._state = s["state"]
    ctl._pending, ctl._previous = s["pending"], s["previous"]
    ctl._rejected = s["rejected"]
    ctl._predicted = s["predicted"]
    ctl._baseline = s["baseline"]
    ctl._recent = s["recent"]
    ctl._fitted_at = s["fitted_at"]
    ctl._reference = s["reference"]
    ctl.windows_seen = s["windows_seen"]
    ctl._history.load_state_dict(s["history"])
    ctl._before, ctl._changed, ctl._trial = s["before"], s["changed"], s["trial"]
    ctl._rolled_back = s["rolled_back"]
    if ctl._segments is not None:
        try:
            ctl._segments.load_state_dict(d.get("segments", []))
        except (KeyError, TypeError, ValueError) as err:
            raise StateError("controller.segments", str(err)) from None
    ctl.model.load_state_dict(s["model"])
