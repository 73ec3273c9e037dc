"""The plan value: per-rank micro-batch sizes that split one global batch.

A *plan* is a tuple ``(b_1, ..., b_N)`` of positive integers with ``sum(b) == B``.
This module holds the pure arithmetic on plans that both the controller core and the
Lightning layer need: validation with errors that name the offending argument, the even
split, rounding fractions to sizes by largest remainder, and splitting a shorter final
global batch in proportion to a plan. It imports neither Lightning nor torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Plan = tuple[int, ...]

__all__ = ["Plan", "even_plan", "round_fractions", "split_in_proportion", "validate_plan"]


def even_plan(total: int, world_size: int) -> Plan:
    """Split ``total`` samples as evenly as possible over ``world_size`` ranks.

    Args:
        total: The global batch size B.
        world_size: The number of ranks N.

    Returns:
        A plan whose sizes differ by at most one; the lowest ranks take the remainder.

    Raises:
        ValueError: If ``world_size < 1`` or ``total < world_size``.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if total < world_size:
        raise ValueError(
            f"the global batch ({total}) must hold at least one sample per rank "
            f"({world_size} ranks)"
        )
    base, rem = divmod(total, world_size)
    return tuple(base + (1 if r < rem else 0) for r in range(world_size))


def round_fractions(fractions: Sequence[float], total: int, minimum: int = 1) -> Plan:
    """Round fractions of ``total`` to integer sizes by largest remainder.

    Every rank first gets ``minimum``; the remaining ``total - N * minimum`` samples are
    shared in proportion to the fractions, floors first, then one extra sample to each of
    the ranks with the largest remainders. Ties go to the lowest rank. The result sums to
    ``total`` exactly.

    Args:
        fractions: Non-negative per-rank fractions that sum to 1 (within 1e-6).
        total: The global batch size B to split.
        minimum: The smallest size any rank may get.

    Returns:
        The integer plan.

    Raises:
        ValueError: If the fractions are negative, do not sum to 1, or ``total`` cannot give
            every rank ``minimum`` samples.
    """
    n_ranks = len(fractions)
    if n_ranks == 0:
        raise ValueError("batch_fractions must not be empty")
    if any((not math.isfinite(f)) or f < 0 for f in fractions):
        raise ValueError(f"batch_fractions must be finite and >= 0, got {list(fractions)}")
    fraction_sum = float(sum(fractions))
    if abs(fraction_sum - 1.0) > 1e-6:
        raise ValueError(f"batch_fractions must sum to 1 (within 1e-6), got sum {fraction_sum!r}")
    if minimum < 1:
        raise ValueError(f"min_micro_batch_size must be >= 1, got {minimum}")
    spare = total - n_ranks * minimum
    if spare < 0:
        raise ValueError(
            f"a global batch of {total} cannot give each of {n_ranks} ranks min_micro_batch_size="
            f"{minimum} samples"
        )
    # Share `spare` in proportion to the fractions, but so that the final sizes track
    # f_r * total as closely as the minimum allows: give each rank max(0, f_r*total - min).
    want = [max(0.0, f / fraction_sum * total - minimum) for f in fractions]
    wsum = sum(want)
    quotas = [w / wsum * spare for w in want] if wsum > 0 else [spare / n_ranks] * n_ranks
    floors = [math.floor(q + 1e-12) for q in quotas]
    left = spare - sum(floors)
    order = sorted(range(n_ranks), key=lambda r: (-(quotas[r] - floors[r]), r))
    for rank in order[:left]:
        floors[rank] += 1
    return tuple(minimum + f for f in floors)


def split_in_proportion(count: int, plan: Sequence[int], minimum: int = 1) -> Plan:
    """Split a shorter final global batch of ``count`` samples in proportion to ``plan``.

    Every rank gets at least ``minimum`` samples (the plan's ``min_micro_batch_size``: a
    BatchNorm layer cannot train on one sample), so ``count`` must be at least
    ``minimum x len(plan)``.

    Args:
        count: The number of samples in the final partial global batch.
        plan: The plan in force for that batch.
        minimum: The fewest samples any rank gets.

    Returns:
        A plan summing to ``count``.

    Raises:
        ValueError: If ``count < minimum x len(plan)``.
    """
    total = sum(plan)
    if count == total:
        return tuple(int(b) for b in plan)
    return round_fractions([b / total for b in plan], count, minimum=minimum)


def validate_plan(
    sizes: Sequence[int],
    total: int,
    world_size: int,
    minimum: int = 1,
    maximum: Sequence[int | None] | int | None = None,
    name: str = "micro_batch_sizes",
) -> Plan:
    """Check a plan against the global batch, the world size and the bounds.

    Args:
        sizes: The proposed per-rank sizes.
        total: The global batch size B the sizes must sum to.
        world_size: The number of ranks N; ``len(sizes)`` must equal it.
        minimum: The smallest allowed size (``min_micro_batch_size``).
        maximum: An optional upper bound, one int for all ranks or one per rank (None for
            no bound on that rank).
        name: The argument name used in error messages.

    Returns:
        The plan as a tuple of Python ints.

    Raises:
        ValueError: Naming ``name`` and the allowed values, when the plan breaks a rule.
    """
    plan = tuple(int(b) for b in sizes)
    if any(int(b) != b for b in sizes):
        raise ValueError(f"{name} must be integers, got {list(sizes)}")
    if len(plan) != world_size:
        raise ValueError(
            f"{name} must have one entry per rank: expected {world_size} entries, got "
            f"{len(plan)} ({list(plan)})"
        )
    low = [r for r, b in enumerate(plan) if b < minimum]
    if low:
        raise ValueError(
            f"{name} must be >= min_micro_batch_size={minimum} on every rank; ranks {low} have "
            f"{[plan[r] for r in low]}"
        )
    if sum(plan) != total:
        raise ValueError(
            f"{name} must sum to the global batch B={total} (batch_size x world_size), got "
            f"sum {sum(plan)} for {list(plan)}"
        )
    if maximum is not None:
        caps = [maximum] * world_size if isinstance(maximum, int) else list(maximum)
        high = [r for r, (b, c) in enumerate(zip(plan, caps)) if c is not None and b > c]
        if high:
            raise ValueError(
                f"{name} exceeds max_micro_batch_size on ranks {high}: sizes "
                f"{[plan[r] for r in high]}, caps {[caps[r] for r in high]}"
            )
    return plan
