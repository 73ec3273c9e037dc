"""UnevenBatchSampler: coverage, equal counts, DDP equivalence and resume, in-process."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DistributedSampler

from lightning_rex.core.plans.plan import even_plan
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.data.sampler import UnevenBatchSampler


def _random_plan(rng: random.Random, total: int, n: int) -> tuple[int, ...]:
    cuts = sorted(rng.sample(range(1, total), n - 1)) if n > 1 else []
    bounds = [0, *cuts, total]
    return tuple(bounds[i + 1] - bounds[i] for i in range(n))


def _ranks(
    n_samples: int,
    bs: int,
    world: int,
    accumulate: int,
    drop_last: bool,
    seed: int,
    plan: tuple[int, ...] | None = None,
    batch_range: tuple[int, int] | None = None,
) -> list[UnevenBatchSampler]:
    plan = plan or even_plan(bs * world, world)
    return [
        UnevenBatchSampler(
            n_samples,
            bs * world,
            plan,
            r,
            seed=seed,
            drop_last=drop_last,
            accumulate_grad_batches=accumulate,
            batch_range=batch_range,
        )
        for r in range(world)
    ]


@settings(max_examples=150, deadline=None)
@given(
    n_samples=st.integers(0, 300),
    bs=st.integers(1, 12),
    world=st.integers(1, 6),
    accumulate=st.integers(1, 3),
    drop_last=st.booleans(),
    seed=st.integers(0, 10_000),
    schedule_seed=st.integers(0, 10_000),
)
def test_coverage_under_random_plan_changes(
    n_samples: int,
    bs: int,
    world: int,
    accumulate: int,
    drop_last: bool,
    seed: int,
    schedule_seed: int,
) -> None:
    total = bs * world
    samplers = _ranks(n_samples, bs, world, accumulate, drop_last, seed)
    rng = random.Random(schedule_seed)
    for epoch in range(2):
        for s in samplers:
            s.set_epoch(epoch)
        iters = [iter(s) for s in samplers]
        per_rank: list[list[list[int]]] = [[] for _ in range(world)]
        # ranks prefetch different amounts ahead of each other, like DataLoader workers
        done = [False] * world
        while not all(done):
            for r in range(world):
                for _ in range(rng.randint(0, 2)):
                    if done[r]:
                        break
                    try:
                        per_rank[r].append(next(iters[r]))
                    except StopIteration:
                        done[r] = True
            if rng.random() < 0.3 and total > world:
                fetched = max(s.last_fetched_step() for s in samplers)
                step = fetched + 1 + rng.randint(0, 2)
                new = _random_plan(rng, total, world)
                for s in samplers:
                    s.schedule_plan(new, step)
        counts = {len(b) for b in per_rank}
        assert len(counts) == 1, "every rank yields the same number of batches"
        nb = counts.pop()
        assert nb == len(samplers[0])
        perm = list(iter(samplers[0].sampler))
        seen: list[int] = []
        for k in range(nb):
            parts = [per_rank[r][k] for r in range(world)]
            assert all(len(p) >= 1 for p in parts), "no empty micro-batch"
            glob = [i for p in parts for i in p]
            assert glob == perm[k * total : k * total + len(glob)], (
                "contiguous slices of one permutation"
            )
            assert list(map(len, parts)) == list(samplers[0].sizes_for_batch(k))
            seen += glob
        assert len(seen) == len(set(seen)), "no sample twice"
        full, rem = divmod(n_samples, total)
        expect = full * total + (rem if (rem >= world and not drop_last) else 0)
        assert sorted(seen) == sorted(perm[:expect]), "every kept sample exactly once"


@settings(max_examples=60, deadline=None)
@given(
    n_samples=st.integers(1, 300),
    bs=st.integers(1, 10),
    world=st.integers(1, 5),
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 3),
)
def test_even_plan_matches_ddp_global_batches(
    n_samples: int, bs: int, world: int, seed: int, epoch: int
) -> None:
    samplers = _ranks(n_samples, bs, world, 1, False, seed)
    ddp = []
    for r in range(world):
        ds = DistributedSampler(
            range(n_samples), num_replicas=world, rank=r, shuffle=True, seed=seed
        )
        ds.set_epoch(epoch)
        ddp.append(list(BatchSampler(ds, bs, drop_last=False)))
    for s in samplers:
        s.set_epoch(epoch)
    ours = [list(s) for s in samplers]
    full = n_samples // (bs * world)
    for k in range(full):
        assert sorted(i for r in range(world) for i in ours[r][k]) == sorted(
            i for r in range(world) for i in ddp[r][k]
        )


def test_final_batch_smaller_than_world_is_dropped() -> None:
    s = _ranks(64 * 2 + 3, 16, 4, 1, False, 0)
    assert len(s[0]) == 2  # 3 leftover samples < 4 ranks
    s = _ranks(64 * 2 + 4, 16, 4, 1, False, 0)
    assert len(s[0]) == 3 and s[0].sizes_for_batch(2) == (1, 1, 1, 1)


def test_final_batch_gives_every_rank_the_minimum_size() -> None:
    # BatchNorm's default bound is 2: a final batch of [4, 1] would fail in training mode
    def sampler(n: int, rank: int) -> UnevenBatchSampler:
        return UnevenBatchSampler(n, 16, (12, 4), rank, bounds=SizeBounds(2))

    assert len(sampler(69, 0)) == 5 and sampler(69, 0).sizes_for_batch(4) == (3, 2)
    batches = [list(sampler(69, r)) for r in range(2)]
    assert [len(b) for b in batches[1]] == [4, 4, 4, 4, 2]
    assert sorted(i for rank in batches for b in rank for i in b) == list(range(69))
    assert len(sampler(67, 0)) == 4  # 3 left over < 2 ranks x 2: dropped, as too few for ranks
    assert min(len(b) for r in range(2) for b in sampler(67, r)) >= 2


def test_a_checkpoint_from_before_the_minimum_still_loads() -> None:
    # saved before states carried min_size: its final batch of 3 was cut [2, 1] (5 batches)
    old = UnevenBatchSampler(67, 16, (12, 4), 0)
    assert len(old) == 5
    state = old.state_dict(5)
    del state["min_size"]
    new = UnevenBatchSampler(67, 16, (12, 4), 0, bounds=SizeBounds(2))
    assert len(new) == 4  # the live run drops a final batch too small for 2 x 2
    assert new.check_state(state)["finished"]
    new.load_state_dict(state)
    assert new.state_dict(5)["min_size"] == 2


def test_final_batch_split_in_proportion() -> None:
    s = UnevenBatchSampler(64 + 20, 64, (48, 16), 0)
    assert s.sizes_for_batch(1) == (15, 5)


def test_set_epoch_reaches_the_permutation_through_dot_sampler() -> None:
    s = UnevenBatchSampler(100, 10, (6, 4), 0)
    a = list(s)
    s.sampler.set_epoch(1)  # what Lightning calls: loader.batch_sampler.sampler.set_epoch
    assert s.epoch == 1 and list(s) != a


def test_plan_change_waits_for_fetched_batches_and_accumulation_windows() -> None:
    s = UnevenBatchSampler(640, 64, (32, 32), 0, accumulate_grad_batches=2)
    it = iter(s)
    for _ in range(3):  # batches 0,1 (step 0) and 2 (step 1) fetched
        next(it)
    assert s.last_fetched_step() == 1
    with pytest.raises(ValueError, match="already fetched"):
        s.schedule_plan((48, 16), 1)
    s.schedule_plan((48, 16), 2)
    sizes = [len(next(it)) for _ in range(3)]  # batch 3 (step 1), batches 4,5 (step 2)
    assert sizes == [32, 48, 48]


@pytest.mark.parametrize("consumed", [0, 3, 7, 10])
def test_state_dict_resume_continues_exactly(consumed: int) -> None:
    def make() -> UnevenBatchSampler:
        return UnevenBatchSampler(10 * 24 + 5, 24, (16, 8), 1, seed=3)

    a = make()
    a.set_epoch(2)
    it = iter(a)
    got = [next(it) for _ in range(consumed)]
    a.schedule_plan((4, 20), a.last_fetched_step() + 1)
    rest_a = list(it)
    state = a.state_dict(consumed=consumed)

    b = make()
    b.load_state_dict(state)
    assert b.epoch == 2 and b.schedule == a.schedule
    rest_b = list(b)
    if consumed < len(a):
        assert rest_b == rest_a
    assert len(got) + len(rest_a) == len(a)


@pytest.mark.parametrize("consumed", [0, 1, 4, 7])
@pytest.mark.parametrize("new_world", [1, 3])
def test_resume_on_another_world_size_uses_each_sample_once(consumed: int, new_world: int) -> None:
    n, bs = 7 * 20 + 9, 10
    old = [UnevenBatchSampler(n, 2 * bs, (13, 7), r, seed=5) for r in range(2)]
    for s in old:
        s.set_epoch(3)
    its = [iter(s) for s in old]
    seen = [i for _ in range(consumed) for it in its for i in next(it)]
    state = old[0].state_dict(consumed=consumed)
    new = [
        UnevenBatchSampler(n, new_world * bs, even_plan(new_world * bs, new_world), r, seed=5)
        for r in range(new_world)
    ]
    for s in new:
        s.load_state_dict(state)
    rest = [list(s) for s in new]
    assert {len(r) for r in rest} == {len(new[0]) - consumed}
    for k in range(len(rest[0])):
        seen += [i for r in range(new_world) for i in rest[r][k]]
        assert sum(new[0].sizes_for_batch(consumed + k)) <= new_world * bs
    assert len(seen) == len(set(seen))  # nothing repeated
    perm = list(iter(old[0].sampler))
    tail = n - len(seen)
    assert sorted(seen) == sorted(perm[: n - tail]) and tail < new_world  # nothing lost

    # the next epoch is an ordinary one with the new global batch
    for s in new:
        s.set_epoch(4)
    assert (
        len(list(iter(new[0])))
        == len(new[0])
        == -(-n // (new_world * bs)) - (1 if 0 < n % (new_world * bs) < new_world else 0)
    )


def test_permutation_is_ddps_randperm() -> None:
    s = UnevenBatchSampler(50, 10, (5, 5), 0, seed=11)
    s.set_epoch(4)
    g = torch.Generator()
    g.manual_seed(15)
    assert list(iter(s.sampler)) == torch.randperm(50, generator=g).tolist()


@settings(max_examples=150, deadline=None)
@given(
    n_samples=st.integers(0, 400),
    world=st.integers(1, 5),
    accumulate=st.integers(1, 3),
    drop_last=st.booleans(),
    seed=st.integers(0, 10_000),
    schedule_seed=st.integers(0, 10_000),
    resume_at=st.one_of(st.none(), st.integers(0, 60)),
)
def test_global_batch_changes_mid_epoch_keep_exactly_once_coverage(
    n_samples: int,
    world: int,
    accumulate: int,
    drop_last: bool,
    seed: int,
    schedule_seed: int,
    resume_at: int | None,
) -> None:
    """Global batch scaling: plans of another ``B`` scheduled at any free step, mid-epoch,
    and a checkpoint and resume anywhere: every rank yields the same number of batches, the
    batches are contiguous slices of one permutation, and every sample the epoch keeps is
    used exactly once."""
    lo, hi = world, 8 * world
    rng = random.Random(schedule_seed)

    def make() -> list[UnevenBatchSampler]:
        return _ranks(n_samples, 2, world, accumulate, drop_last, seed, batch_range=(lo, hi))

    samplers = make()
    for epoch in range(2):
        for s in samplers:
            s.set_epoch(epoch)
        iters = [iter(s) for s in samplers]
        per_rank: list[list[list[int]]] = [[] for _ in range(world)]
        done = [False] * world
        batches = 0
        while not all(done):
            for r in range(world):
                if not done[r]:
                    try:
                        per_rank[r].append(next(iters[r]))
                    except StopIteration:
                        done[r] = True
            batches += 1
            if rng.random() < 0.3:
                fetched = max(s.last_fetched_step() for s in samplers)
                step = fetched + 1 + rng.randint(0, 2)
                new = (
                    _random_plan(rng, rng.randint(lo, hi), world)
                    if world > 1
                    else (rng.randint(lo, hi),)
                )
                for s in samplers:
                    s.schedule_plan(new, step)
            if epoch == 0 and resume_at is not None and batches == resume_at and not any(done):
                # a checkpoint after the batches trained so far, then a fresh process
                consumed = len(per_rank[0])
                assert {len(b) for b in per_rank} == {consumed}
                states = [s.state_dict(consumed) for s in samplers]
                samplers = make()
                for s, st_ in zip(samplers, states):
                    s.load_state_dict(st_)
                iters = [iter(s) for s in samplers]
        counts = {len(b) for b in per_rank}
        assert len(counts) == 1, "every rank yields the same number of batches"
        perm = list(iter(samplers[0].sampler))
        seen = [i for k in range(counts.pop()) for r in range(world) for i in per_rank[r][k]]
        assert all(len(per_rank[r][k]) >= 1 for r in range(world) for k in range(len(per_rank[r])))
        assert seen == perm[: len(seen)], "contiguous slices of one permutation, in order"
        assert len(seen) == len(set(seen)), "no sample twice"
        # what is left over is a final partial batch: too small for every rank, or dropped
        left = n_samples - len(seen)
        assert left < (hi if drop_last else world)


def test_a_smaller_batch_from_the_next_epoch_does_not_recut_a_finished_one() -> None:
    # drop_last: 20 samples in batches of 8 leave 4 dropped. A batch of 4 scheduled at the
    # first free step (the next epoch's first) must not turn those 4 into a batch of this
    # epoch, which Lightning has already ended
    samplers = _ranks(20, 4, 2, 1, True, 0, batch_range=(2, 16))
    for s in samplers:
        s.set_epoch(0)
    got = [list(iter(s)) for s in samplers]
    assert [len(g) for g in got] == [2, 2] and len(samplers[0]) == 2
    step = max(s.first_free_step() for s in samplers)
    for s in samplers:
        s.schedule_plan((2, 2), step)
    assert len(samplers[0]) == 2
    for s in samplers:
        s.set_epoch(1)
    assert len(samplers[0]) == 5  # the next epoch: 20 samples in batches of 4
    assert [len(list(iter(s))) for s in samplers] == [5, 5]
