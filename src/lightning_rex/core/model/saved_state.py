"""Checking a saved rank time model, field by field, before it is loaded."""

from __future__ import annotations

from typing import Any

from lightning_rex.core.saved import (
    StateError,
    field,
    float_list,
    int_list,
    matrix,
    optional,
    real,
    whole,
)

__all__ = ["check_model_state"]


def check_model_state(d: Any, world_size: int, name: str = "model") -> dict[str, Any]:
    """Check saved model state against the number of ranks, without loading it.

    Args:
        d: A dictionary from :meth:`state_dict`, possibly through JSON.
        world_size: The number of ranks ``N``.
        name: The dotted name of ``d``, for errors.

    Returns:
        The state, normalised to plain Python types.

    Raises:
        StateError: Naming the first field that is missing or has the wrong shape.
    """
    sizes = field(d, "sizes", name)
    if not isinstance(sizes, list):
        raise StateError(f"{name}.sizes", "must be a list of per-window plans")
    out: dict[str, Any] = {
        "outputscale": real(field(d, "outputscale", name), f"{name}.outputscale", True),
        "n_fits": whole(field(d, "n_fits", name), f"{name}.n_fits", 0),
        "scale": optional(field(d, "scale", name), float_list, f"{name}.scale", world_size, True),
        "first_u": optional(
            field(d, "first_u", name), float_list, f"{name}.first_u", world_size, True
        ),
        "sizes": [int_list(r, f"{name}.sizes[{i}]", world_size, 1) for i, r in enumerate(sizes)],
        "medians": matrix(
            field(d, "medians", name), f"{name}.medians", len(sizes), world_size, True
        ),
        "rel_var": float_list(field(d, "rel_var", name), f"{name}.rel_var", len(sizes), True),
        "n_added": whole(field(d, "n_added", name), f"{name}.n_added", len(sizes)),
        "cutoff": int_list(field(d, "cutoff", name), f"{name}.cutoff", world_size, 0),
        "group": int_list(d.get("group", list(range(world_size))), f"{name}.group", world_size, 0),
    }
    grp = out["group"]
    if any(g > r or grp[g] != g for r, g in enumerate(grp)):
        raise StateError(f"{name}.group", "must map each rank to its group's first member")
    if sizes and out["scale"] is None:
        raise StateError(f"{name}.scale", "must be set once windows are held")
    return out
