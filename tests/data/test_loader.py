"""The processed loader across a resume on any world size, as Lightning's fit loop drives it.

Property test over random (old world, new world, position) triples: the old ranks consume
some batches (with plan changes), the checkpoint's loader state is restored on the new
ranks the way RexStrategy and Lightning do it (the strategy restores it in
process_dataloader, Lightning then sizes the epoch from len(loader) and restores it once
more), and the rest of the epoch is iterated as the fit loop does. Every sample of the
epoch must be used exactly once, except a final global batch smaller than the world.
"""

from __future__ import annotations

import random

from hypothesis import example, given, settings
from hypothesis import strategies as st
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torch.utils.data import Dataset

from lightning_rex.core.plans.plan import even_plan
from lightning_rex.data.loader import RexDataLoader
from lightning_rex.data.sampler import UnevenBatchSampler


class _Indices(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _loaders(n: int, bs: int, world: int, seed: int) -> list[RexDataLoader]:
    ds = _Indices(n)
    plan = even_plan(bs * world, world)
    return [
        RexDataLoader(ds, UnevenBatchSampler(n, bs * world, plan, r, seed=seed))
        for r in range(world)
    ]


@settings(max_examples=120, deadline=None)
# a checkpoint at the very end of an epoch, resumed on fewer ranks (longer epoch there)
@example(n=2, bs=1, old=2, new=1, where=1.0, seed=0)
@given(
    n=st.integers(1, 260),
    bs=st.integers(1, 12),
    old=st.integers(1, 4),
    new=st.integers(1, 4),
    where=st.floats(0.0, 1.0),
    seed=st.integers(0, 1000),
)
def test_resume_on_any_world_size_uses_every_sample_once(
    n: int, bs: int, old: int, new: int, where: float, seed: int
) -> None:
    rng = random.Random(seed)
    before = _loaders(n, bs, old, seed)
    for dl in before:
        dl.batch_sampler.set_epoch(1)
    length = len(before[0])
    consumed = int(where * length)
    its = [iter(dl) for dl in before]
    used: list[int] = []
    for _ in range(consumed):
        for it in its:
            used += next(it).tolist()
        if rng.random() < 0.3 and old * bs > old:  # a plan change mid-epoch
            cuts = sorted(rng.sample(range(1, old * bs), old - 1))
            plan = [b - a for a, b in zip([0, *cuts], [*cuts, old * bs])]
            for dl in before:
                dl.batch_sampler.schedule_plan(plan, dl.batch_sampler.first_free_step())
    saved = before[0].state_dict()

    after = _loaders(n, bs, new, seed)
    taken = []
    for dl in after:
        dl.load_state_dict(saved)  # RexStrategy.process_dataloader, before Lightning sizes it
        combined = CombinedLoader(dl, "max_size_cycle")
        combined.limits = [len(dl)]  # fit_loop.setup_data: the epoch's length, then ...
        combined._load_state_dicts([saved])  # ... Lightning's own restore
        it = iter(combined)
        ready, mine = consumed, []
        while ready < len(combined):  # the fit loop stops at max_batches or exhaustion
            try:
                batch, _, _ = next(it)
            except StopIteration:
                break
            mine.append(batch.tolist())
            ready += 1
        taken.append(mine)
    assert len({len(t) for t in taken}) == 1, "every rank runs the same number of steps"
    used += [i for t in taken for b in t for i in b]
    assert len(used) == len(set(used)), "no sample twice"
    perm = list(iter(after[0].batch_sampler.sampler))
    missing = set(perm) - set(used)
    tail = max(0, n - len(used))
    assert len(missing) == tail and tail < max(old, new), (len(missing), old, new)
    assert missing <= set(perm[n - tail :])  # only the last, too-small global batch
