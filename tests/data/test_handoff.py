"""EpochHandoff: a resume at an epoch's end, as Lightning moves the sampler, in-process.

The sampler is restored from a checkpoint taken at epoch 0's end and moved the ways
Lightning moves it: after its own judgement of the restored epoch, before a DataLoader with
workers began or after, back to the restored epoch, and across a rebuilt loader.
"""

from __future__ import annotations

import pytest
from tests.data.test_sampler import _ranks

from lightning_rex.data.sampler import UnevenBatchSampler


def _restored_at_epoch_end(step_source: bool) -> list[UnevenBatchSampler]:
    # 20 samples: steps 0-1 at B=8, then B=4 from step 2, so epoch 0 ends after step 2; a
    # checkpoint there restores epoch 0 as finished, and epoch 1 (step 3 on) has 5 batches
    samplers = _ranks(20, 4, 2, 1, False, 0, batch_range=(2, 16))
    for s in samplers:
        s.set_epoch(0)
        s.schedule_plan((2, 2), 2)
    assert [len(list(iter(s))) for s in samplers] == [3, 3]
    states = [s.state_dict(consumed=3) for s in samplers]
    resumed = _ranks(20, 4, 2, 1, False, 0, batch_range=(2, 16))
    for s, state in zip(resumed, states):
        if step_source:
            s.step_source = lambda: 3  # the steps the fit has done
        s.load_state_dict(state)
    return resumed


def _whole_epoch(batches: list[list[list[int]]]) -> None:
    assert [len(b) for b in batches] == [5, 5]
    assert sorted(i for b in batches for batch in b for i in batch) == list(range(20))


@pytest.mark.parametrize("step_source", [False, True])
def test_the_epoch_after_a_finished_restored_one_is_sized_from_its_own_start(
    step_source: bool,
) -> None:
    # sized from epoch 0's start (8, 8, 4) epoch 1 would be cut at 3 batches
    resumed = _restored_at_epoch_end(step_source)
    told: list[int] = []
    for s in resumed:
        s.on_epoch_set(told.append)
        assert len(s) == 3  # the restored epoch, as Lightning counted it
        s.set_epoch(1)
        assert len(s) == 5
    # Lightning, resuming, checks the restored epoch against its count after moving the
    # sampler on: the move is not told, the length is due (once) instead
    assert told == []
    assert [s.take_length_due() for s in resumed] == [True, True]
    assert [s.take_length_due() for s in resumed] == [False, False]
    _whole_epoch([list(iter(s)) for s in resumed])


def test_a_loader_begun_before_the_move_past_a_finished_epoch_serves_the_next() -> None:
    # a DataLoader with workers iterates (fetches ahead) when Lightning creates its iterator,
    # before Lightning moves the sampler from the restored, finished epoch 0 to epoch 1
    resumed = _restored_at_epoch_end(step_source=False)
    told: list[int] = []
    for s in resumed:
        s.on_epoch_set(told.append)
    iters = [iter(s) for s in resumed]
    firsts = [next(it) for it in iters]
    assert [s.epoch for s in resumed] == [1, 1]
    for s in resumed:
        s.set_epoch(1)  # Lightning's move comes later
    assert told == [] and [s.take_length_due() for s in resumed] == [True, True]
    assert [len(s) for s in resumed] == [5, 5]
    _whole_epoch([[first, *it] for first, it in zip(firsts, iters)])
    # without a listener (a custom loop that moves the epoch itself), the restored epoch
    # iterates as over
    alone = _restored_at_epoch_end(step_source=False)
    assert [list(iter(s)) for s in alone] == [[], []]
    for s in alone:
        s.set_epoch(1)
    _whole_epoch([list(iter(s)) for s in alone])


def test_a_state_restored_as_over_moves_on_whatever_its_batches_left() -> None:
    # Lightning ended epoch 0 after 2 of its 3 batches (limit_train_batches) and saved at its
    # end: the resumed run starts epoch 1 whole, under the saved schedule
    samplers = _ranks(20, 4, 2, 1, False, 0, batch_range=(2, 16))
    for s in samplers:
        s.set_epoch(0)
        s.schedule_plan((2, 2), 2)
    states = [s.state_dict(consumed=2) for s in samplers]
    resumed = _ranks(20, 4, 2, 1, False, 0, batch_range=(2, 16))
    for s, state in zip(resumed, states):
        s.load_state_dict(state, over=True)
        # Lightning's count of it: the whole epoch, which Lightning's limit cuts
        assert s.awaiting_move and len(s) == 3 and s.schedule == samplers[0].schedule
        assert s.last_fetched_step() == 1  # 2 steps trained
        s.on_epoch_set(lambda epoch: None)
        s.set_epoch(1)
        assert not s.awaiting_move and s.take_length_due()
    # epoch 1 starts at step 2, at B=4: 5 batches
    _whole_epoch([list(iter(s)) for s in resumed])


def test_a_move_begun_early_is_undone_when_lightning_stays_in_the_restored_epoch() -> None:
    # validation at the epoch's end, checkpoint after it: Lightning moves the sampler to the
    # restored epoch 0 again (to end it) after the workers began; then on to epoch 1
    resumed = _restored_at_epoch_end(step_source=False)
    told: list[int] = []
    for s in resumed:
        s.on_epoch_set(told.append)
        next(iter(s))  # the workers fetch ahead
        assert s.serves_next_epoch and s.epoch == 1
        s.set_epoch(0)
        assert not s.serves_next_epoch and s.epoch == 0 and len(s) == 3
        s.set_epoch(1)
        assert s.take_length_due()
    assert told == [0, 0]
    _whole_epoch([list(iter(s)) for s in resumed])


def test_a_rebuilt_sampler_carries_the_restored_epoch() -> None:
    # reload_dataloaders_every_n_epochs: Lightning replaces the sampler after the resume and
    # before it moves past the restored epoch
    old = _restored_at_epoch_end(step_source=False)
    for s in old:
        s.on_epoch_set(lambda epoch: None)
        next(iter(s))  # the old loader's workers began
    # the strategy keeps the run's schedule
    new = [
        UnevenBatchSampler(20, 8, (4, 4), r, seed=0, plans=o.plan_schedule, batch_range=(2, 16))
        for r, o in enumerate(old)
    ]
    for s, o in zip(new, old):
        s.carry_restored_epoch(o)
        s.on_epoch_set(lambda epoch: None)
        assert s.awaiting_move and s.epoch == 0 and len(s) == 3
        s.set_epoch(1)
        assert s.take_length_due()
    _whole_epoch([list(iter(s)) for s in new])
