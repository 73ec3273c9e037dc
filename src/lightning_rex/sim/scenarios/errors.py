"""The simulator's input error (its own module, so that every schema module can raise it)."""

from __future__ import annotations

__all__ = ["ScenarioError"]


class ScenarioError(ValueError):
    """A scenario that breaks the schema; the message names the field."""
