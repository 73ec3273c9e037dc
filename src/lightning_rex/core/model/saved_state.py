"""A rank time model's saved form: written, checked field by field, and restored.

:class:`SavedModelState` gives :class:`~lightning_rex.core.model.time_model.RankTimeModel`
its ``state_dict`` / ``load_state_dict``; :func:`check_model_state` checks saved state
before anything is loaded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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

__all__ = ["SavedModelState", "check_model_state"]


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


class SavedModelState:
    """``state_dict`` / ``load_state_dict`` of the rank time model (its stored fields)."""

    world_size: int
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
    pass_caps: np.ndarray | None
    window_caps: list[list[int] | None]
    _post: Any
    _weights_fresh: bool

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: observations, scale, hyperparameters and fit count."""
        return {
            "outputscale": self.outputscale,
            "n_fits": self.n_fits,
            "scale": None if self.scale is None else [float(s) for s in self.scale],
            "first_u": None if self.first_u is None else [float(s) for s in self.first_u],
            "sizes": [list(r) for r in self.sizes],
            "medians": [list(r) for r in self.medians],
            "rel_var": list(self.rel_var),
            "n_added": self.n_added,
            "cutoff": [int(c) for c in self.cutoff],
            "group": [int(g) for g in self.group],
            "pass_caps": None if self.pass_caps is None else [int(c) for c in self.pass_caps],
            "window_caps": [None if r is None else list(r) for r in self.window_caps],
        }

    #: Check saved model state against the number of ranks, without loading it: see
    #: :func:`check_model_state`.
    check_state = staticmethod(check_model_state)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output.

        Args:
            d: A dict from :meth:`state_dict`.

        Raises:
            StateError: Naming the field, when the state does not fit (see
                :meth:`check_state`).
        """
        state = self.check_state(d, self.world_size)
        self.outputscale = state["outputscale"]
        self.n_fits = state["n_fits"]
        self.scale = (
            None if state["scale"] is None else np.asarray(state["scale"], dtype=np.float64)
        )
        self.first_u = (
            None if state["first_u"] is None else np.asarray(state["first_u"], dtype=np.float64)
        )
        self.sizes = state["sizes"]
        self.medians = state["medians"]
        self.rel_var = state["rel_var"]
        self.n_added = state["n_added"]
        self.cutoff = np.asarray(state["cutoff"], dtype=np.int64)
        self.group = np.asarray(state["group"], dtype=np.int64)
        caps = state["pass_caps"]
        self.pass_caps = None if caps is None or not any(caps) else np.asarray(caps, dtype=np.int64)
        self.window_caps = state["window_caps"]
        self._post, self._weights_fresh = None, False
