"""What the controller decides after a window: :class:`Decision`, JSON round-trippable."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.saved import StateError, field, flag, int_list, optional, real, whole

__all__ = ["Decision", "DecisionKind"]

DecisionKind = Literal["hold", "propose", "accept", "rollback"]


@dataclass(frozen=True)
class Decision:
    """What the controller decided after one window.

    Attributes:
        kind: ``"hold"``, ``"propose"``, ``"accept"`` or ``"rollback"``.
        plan: The plan to apply now: the new plan for propose, the previous plan for
            rollback, None for hold and accept.
        predicted_step_s: The model's predicted synchronous compute time (max over ranks) of
            the proposed plan (propose), or of the plan under validation (accept/rollback).
        measured_step_s: The window's measured max over ranks of per-rank medians.
        significance: The window's imbalance test, summarised as
            :meth:`~lightning_rex.core.stats.significance.ImbalanceResult.to_dict` gives it (None
            when no test ran).
        reason: A short human-readable explanation.
        step_end: The last step (exclusive) of the window that led to this decision.
        validated: This window validated the plan under test as non-inferior: True for an
            accept, and for a propose that refines a just-validated plan (see
            :meth:`Controller.observe`).
    """

    kind: DecisionKind
    plan: Plan | None
    predicted_step_s: float | None
    measured_step_s: float | None
    significance: dict[str, Any] | None
    reason: str
    step_end: int = 0
    validated: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the inverse of :meth:`from_dict`)."""
        return {
            "kind": self.kind,
            "plan": None if self.plan is None else list(self.plan),
            "predicted_step_s": self.predicted_step_s,
            "measured_step_s": self.measured_step_s,
            "significance": self.significance,
            "reason": self.reason,
            "step_end": self.step_end,
            "validated": self.validated,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], name: str = "decision") -> Decision:
        """Rebuild a decision from :meth:`to_dict` output, checking every field.

        Args:
            d: The dictionary.
            name: Its dotted name, for errors.

        Returns:
            The decision.

        Raises:
            StateError: Naming the field that is missing or malformed.
        """
        kind = field(d, "kind", name)
        if kind not in ("hold", "propose", "accept", "rollback"):
            raise StateError(f"{name}.kind", f"must be hold, propose, accept or rollback: {kind!r}")
        plan = optional(field(d, "plan", name), int_list, f"{name}.plan", None, 1)
        sig = field(d, "significance", name)
        if sig is not None and not isinstance(sig, dict):
            raise StateError(f"{name}.significance", "must be a mapping or null")
        return cls(
            kind=kind,
            plan=None if plan is None else tuple(plan),
            predicted_step_s=optional(field(d, "predicted_step_s", name), real, f"{name}.pred"),
            measured_step_s=optional(field(d, "measured_step_s", name), real, f"{name}.measured"),
            significance=sig,
            reason=str(field(d, "reason", name)),
            step_end=whole(field(d, "step_end", name), f"{name}.step_end", 0),
            validated=flag(field(d, "validated", name), f"{name}.validated"),
        )
