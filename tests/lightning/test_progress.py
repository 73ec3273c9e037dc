"""What REX reads of the fit loop's progress (lightning/progress.py)."""

from types import SimpleNamespace
from typing import Any

import pytest
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.callbacks import timer as timer_module
from tests.helpers.models import RegModel, make_dataset
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader

import lightning as L
from lightning_rex.lightning.progress import fraction_done, loader_state_to_restore


class _Shares(L.Callback):
    def __init__(self, stop_after: int | None) -> None:
        self.shares: list[float | None] = []
        self.stop_after = stop_after

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.shares.append(fraction_done(trainer))
        if len(self.shares) == self.stop_after:
            trainer.should_stop = True


def _fit(stop_after: int | None = None, **kwargs: Any) -> list[float | None]:
    shares = _Shares(stop_after)
    trainer = quiet_trainer(devices=1, callbacks=[shares], **kwargs)
    trainer.fit(RegModel(), DataLoader(make_dataset(32), batch_size=8))  # 4 batches an epoch
    return shares.shares


@pytest.mark.parametrize(
    ("bounds", "expected"),
    [
        # epochs alone: a batch of the 8 is an eighth of the fit
        (dict(max_epochs=2), [k / 8 for k in range(1, 9)]),
        # steps end the fit first: their share is the larger
        (dict(max_epochs=10, max_steps=5), [k / 5 for k in range(1, 6)]),
        # epochs end it first: theirs is
        (dict(max_epochs=1, max_steps=100), [k / 4 for k in range(1, 5)]),
    ],
)
def test_the_fit_is_as_far_as_the_bound_that_ends_it_first(bounds, expected):
    assert _fit(**bounds) == pytest.approx(expected)


def test_a_fit_without_finite_bounds_has_no_share_done():
    assert _fit(stop_after=6, max_epochs=-1, max_steps=-1) == [None] * 6


class _Clock(L.Callback):
    """Lightning's Timer reads this clock: each batch takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.now, self.seconds = 0.0, seconds

    def monotonic(self) -> float:
        return self.now

    def on_train_batch_start(self, *args: Any) -> None:
        self.now += self.seconds


def _timed_fit(
    monkeypatch: pytest.MonkeyPatch, seconds: float, **kwargs: Any
) -> list[float | None]:
    clock = _Clock(seconds)
    monkeypatch.setattr(timer_module, "time", clock)  # the Timer's own module only
    shares = _Shares(None)
    callbacks = [clock, shares, *kwargs.pop("extra", [])]
    trainer = quiet_trainer(devices=1, callbacks=callbacks, **kwargs)
    trainer.fit(RegModel(), DataLoader(make_dataset(32), batch_size=8))
    return shares.shares


def test_max_time_is_a_bound_its_share_of_the_training_time(monkeypatch):
    # 10 s a batch against 100 s: a tenth a batch, and the Timer ends the fit at the tenth
    shares = _timed_fit(monkeypatch, 10.0, max_time={"seconds": 100}, max_epochs=-1, max_steps=-1)
    assert shares == pytest.approx([k / 10 for k in range(1, 11)])
    # with max_steps too, the bound that ends the fit first is the furthest along
    shares = _timed_fit(monkeypatch, 10.0, max_time={"seconds": 100}, max_epochs=-1, max_steps=5)
    assert shares == pytest.approx([k / 5 for k in range(1, 6)])
    shares = _timed_fit(monkeypatch, 10.0, max_time={"seconds": 40}, max_epochs=-1, max_steps=8)
    assert shares == pytest.approx([k / 4 for k in range(1, 5)])


def test_a_timer_without_a_duration_bounds_nothing(monkeypatch):
    shares = _timed_fit(monkeypatch, 10.0, extra=[Timer()], max_epochs=1, max_steps=-1)
    assert shares == pytest.approx([k / 4 for k in range(1, 5)])


def test_the_loader_state_is_restored_when_lightning_would_not_and_only_once() -> None:
    state = {"rex_sampler": {"epoch": 0}}

    def trainer(restarting: bool, states: list[Any]) -> Any:
        loop = SimpleNamespace(restarting=restarting, _combined_loader_states_to_load=states)
        return SimpleNamespace(fit_loop=loop)

    # mid-epoch; taken, so that Lightning does not load it again over the strategy's
    t = trainer(True, [state])
    assert loader_state_to_restore(t) == (state, False)
    assert t.fit_loop._combined_loader_states_to_load == []
    # after a checkpoint at an epoch's end Lightning is not restarting and restores nothing;
    # the plan schedule is in the state: restored as over, and taken, so a loader rebuilt
    # later in the fit does not restore it again
    t = trainer(False, [state])
    assert loader_state_to_restore(t) == (state, True)
    assert loader_state_to_restore(t) is None
    assert loader_state_to_restore(trainer(False, [])) is None
    assert loader_state_to_restore(trainer(True, [{"other": 1}])) is None
