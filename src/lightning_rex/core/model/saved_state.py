"""A rank time model's saved form: written, checked field by field, and restored.

:func:`model_state` is what :class:`~lightning_rex.core.model.time_model.RankTimeModel`'s
``state_dict`` returns; :func:`check_model_state` checks saved state before anything is
loaded.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from lightning_rex.core.model.accumulation import AccumulationCaps
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

__all__ = ["SavedModel", "check_model_state", "model_state"]


class SavedModel(Protocol):
    """The fields of a rank time model that its saved form holds."""

    outputscale: float
    n_fits: int
    scale: np.ndarray | None
    first_u: np.ndarray | None
    sizes: list[list[int]]
    medians: list[list[float]]
    rel_var: list[float]
    n_added: int
    cutoff: np.ndarray
    group: np.ndarray
    passes: AccumulationCaps


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
        # pass caps (0: none), absent from checkpoints before accumulation was priced
        "pass_caps": optional(d.get("pass_caps"), int_list, f"{name}.pass_caps", world_size, 0),
    }
    caps = d.get("window_caps", [None] * len(sizes))
    if not isinstance(caps, list) or len(caps) != len(sizes):
        raise StateError(f"{name}.window_caps", f"must be a list of {len(sizes)} windows' caps")
    out["window_caps"] = [
        optional(r, int_list, f"{name}.window_caps[{i}]", world_size, 0) for i, r in enumerate(caps)
    ]
    grp = out["group"]
    if any(g > r or grp[g] != g for r, g in enumerate(grp)):
        raise StateError(f"{name}.group", "must map each rank to its group's first member")
    if sizes and out["scale"] is None:
        raise StateError(f"{name}.scale", "must be set once windows are held")
    return out


def model_state(model: SavedModel) -> dict[str, Any]:
    """A rank time model's JSON-able state: observations, scale, hyperparameters, fit count.

    Args:
        model: The :class:`~lightning_rex.core.model.time_model.RankTimeModel`.

    Returns:
        What :meth:`~lightning_rex.core.model.time_model.RankTimeModel.load_state_dict`
        restores, and :func:`check_model_state` checks.
    """
    scale, first_u, caps = model.scale, model.first_u, model.passes.current
    return {
        "outputscale": model.outputscale,
        "n_fits": model.n_fits,
        "scale": None if scale is None else [float(value) for value in scale],
        "first_u": None if first_u is None else [float(value) for value in first_u],
        "sizes": [list(row) for row in model.sizes],
        "medians": [list(row) for row in model.medians],
        "rel_var": list(model.rel_var),
        "n_added": model.n_added,
        "cutoff": [int(value) for value in model.cutoff],
        "group": [int(value) for value in model.group],
        "pass_caps": None if caps is None else [int(cap) for cap in caps],
        "window_caps": [None if row is None else list(row) for row in model.passes.windows],
    }
