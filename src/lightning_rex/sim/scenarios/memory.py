"""A scenario's memory: device bytes per rank, bytes per sample, and the pass caps they give.

A scenario may say how much memory each rank's device has (``"memory_bytes"`` on a rank) and
what a training step needs (the top-level ``"memory"`` mapping)::

    "memory": {"fixed_bytes": 4e9, "per_sample_bytes": 2e9}

``fixed_bytes`` is what a rank holds whatever its batch (its shard of the model, its
optimizer state, gradients, the framework's workspace); ``per_sample_bytes`` is one sample's
activations. A rank's *pass cap*, the largest micro-batch it runs in one forward/backward
pass, is then ``floor((memory_bytes - fixed_bytes) / per_sample_bytes)``; a larger micro-batch
runs as accumulation passes (:mod:`lightning_rex.core.passes`, the one home of that rule,
which the engine's times follow). A rank without ``memory_bytes`` has no pass cap. A rank's
``mem_cap`` stays what it was, a hard bound no plan exceeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightning_rex.sim.scenarios.errors import ScenarioError
from lightning_rex.sim.scenarios.fields import check_keys, number

__all__ = ["MAX_BYTES", "MemorySpec", "memory_from_dict", "pass_caps"]

MAX_BYTES = 1e18
"""The largest byte count a memory field may hold."""
_KEYS = {"fixed_bytes", "per_sample_bytes"}


@dataclass(frozen=True)
class MemorySpec:
    """What a training step needs in memory on every rank.

    Attributes:
        per_sample_bytes: One sample's activations, bytes (> 0).
        fixed_bytes: Bytes held whatever the batch: model shard, optimizer state (>= 0).
    """

    per_sample_bytes: float
    fixed_bytes: float = 0.0

    def to_dict(self) -> dict[str, float]:
        """The scenario mapping's ``memory`` entry."""
        return {"fixed_bytes": self.fixed_bytes, "per_sample_bytes": self.per_sample_bytes}


def memory_from_dict(d: Any) -> MemorySpec:
    """Validate a scenario's ``memory`` mapping.

    Args:
        d: The mapping.

    Returns:
        The spec.

    Raises:
        ScenarioError: Naming the field, for unknown keys or values out of range.
    """
    mapping: Mapping[str, Any] = check_keys(d, _KEYS, "memory")
    return MemorySpec(
        per_sample_bytes=number(
            mapping, "per_sample_bytes", "memory.", lo=0.0, lo_open=True, hi=MAX_BYTES
        ),
        fixed_bytes=number(mapping, "fixed_bytes", "memory.", 0.0, lo=0.0, hi=MAX_BYTES),
    )


def pass_caps(
    device_bytes: Sequence[float | None], memory: MemorySpec | None
) -> list[int | None] | None:
    """Each rank's pass cap, ``floor((memory_bytes - fixed_bytes) / per_sample_bytes)``.

    Args:
        device_bytes: Each rank's device memory in bytes (None where not given).
        memory: The step's memory needs, or None.

    Returns:
        Per-rank caps (None where a rank's memory is not given), or None when no rank has
        one.

    Raises:
        ScenarioError: Naming the rank, when a device's memory is given without the
            scenario's ``memory``, or leaves no room for one sample.
    """
    given = [i for i, b in enumerate(device_bytes) if b is not None]
    if not given:
        return None
    if memory is None:
        raise ScenarioError(
            f"ranks[{given[0]}].memory_bytes needs the scenario's memory mapping"
            " (fixed_bytes, per_sample_bytes)"
        )
    caps: list[int | None] = []
    for rank, mem_bytes in enumerate(device_bytes):
        if mem_bytes is None:
            caps.append(None)
            continue
        cap = int((mem_bytes - memory.fixed_bytes) // memory.per_sample_bytes)
        if cap < 1:
            raise ScenarioError(
                f"ranks[{rank}].memory_bytes={mem_bytes:g} holds no sample: fixed_bytes="
                f"{memory.fixed_bytes:g} plus per_sample_bytes={memory.per_sample_bytes:g}"
                " do not fit"
            )
        caps.append(cap)
    return caps
