"""The one window object: its checks, its derived lengths, and who holds it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lightning_rex.core.build import build_decider
from lightning_rex.core.decide.controller import Controller
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.window_spec import WindowSpec, default_looks


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"steps": 4}, "window must be an integer >= 5 steps, got 4"),
        ({"steps": 7.5}, "window must be an integer"),
        ({"steps": 30, "looks": 0}, "looks must be an integer >= 1"),
        ({"steps": 30, "looks": 7}, "looks=7 cuts window=30 into segments of 4"),
        ({"warmup": -1}, "warmup must be an integer >= 0 steps, got -1"),
        ({"max_warmup": True}, "max_warmup must be an integer"),
    ],
)
def test_a_bad_window_names_its_argument(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        WindowSpec(**kwargs)


def test_the_lengths_come_from_the_steps_and_the_looks() -> None:
    spec = WindowSpec()
    assert (spec.steps, spec.looks_per_window, spec.segment, spec.whole) == (30, 3, 10, 30)
    odd = WindowSpec(32, 3)
    assert (odd.segment, odd.whole) == (10, 30)  # the loop gathers whole segments only
    assert [default_looks(w) for w in (5, 19, 20, 30, 90)] == [1, 1, 2, 3, 3]
    # another length keeps a default looks a default (and so re-derives it)
    assert WindowSpec(30).for_steps(12).looks_per_window == 1
    assert WindowSpec(30, 2, warmup=4).for_steps(40) == WindowSpec(40, 2, 4)


def test_the_controller_holds_the_window_it_is_given() -> None:
    spec = WindowSpec(30, 3)
    c = Controller(256, 4, window=spec)
    assert c.settings.window is spec and c.settings.window.looks_per_window == 3
    # without one, whole windows of the settings' length, one look each
    whole = Controller(256, 4, settings=DecisionSettings(window=WindowSpec(40, 2)))
    assert whole.settings.window == WindowSpec(40, 1)


def test_the_builder_hands_the_settings_window_to_the_controller() -> None:
    settings = DecisionSettings(window=WindowSpec(20, 2))
    decider = build_decider(settings, (16, 16), 32, SizeBounds())
    assert isinstance(decider, Controller) and decider.settings.window is settings.window
    other = replace(settings, window=WindowSpec(20, 2))  # equal, yet another object
    assert build_decider(other, (16, 16), 32, SizeBounds()).settings.window is other.window


def test_settings_take_only_a_window_object() -> None:
    with pytest.raises(ValueError, match="window must be a WindowSpec"):
        DecisionSettings(window=30)  # type: ignore[arg-type]
