"""Global batch scaling's settings: :class:`GlobalBatchScaling`, checked at construction."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_rex.core.checks import is_integer, is_number, keywords_checked
from lightning_rex.core.scaling.noise_scale import LR_RULES, LrRule

__all__ = ["MAX_BATCH", "MAX_CANDIDATES", "GlobalBatchScaling"]

MAX_BATCH = 2**24
"""The largest global batch (no plan or grid is built for more)."""
MAX_CANDIDATES = 1024
"""The most batch sizes the acquisition is evaluated on."""


@dataclass(frozen=True)
class GlobalBatchScaling:
    """Opt-in global batch scaling: ``RexCallback(global_batch=GlobalBatchScaling(...))``.

    Args:
        min_global_batch: The smallest global batch (>= the world size).
        max_global_batch: The largest global batch.
        lr_rule: How the learning rate follows ``B``: ``"linear"``, ``"sqrt"`` or
            ``"adascale"`` (AdaScale's gain, from the noise scale).
        min_gain: The smallest predicted goodput gain worth a trial of a new batch, early
            in a run or in a long one (the trial is then kept when its measured gain is
            significant, however small). Nearer the end of a run whose length is known
            (``max_steps``, ``max_epochs`` or ``max_time`` in training), a trial must also
            pay back twice its new shapes' one-off cost over the run that remains, which
            asks more (:func:`~lightning_rex.core.decide.pricing.trial_min_gain`). A trial
            is re-split when its best plan is predicted this much faster.
        confidence: One-sided confidence that a kept change's goodput gain is real.
        decay: Per-step decay of the noise scale's moving averages.
        min_noise_steps: Steps of noise-scale estimates after which a change may rest on
            the estimate alone. Before them (from
            :data:`~lightning_rex.core.scaling.batch_scaling.EARLY_STEPS` steps) a change is
            proposed only when it pays even at the pessimistic end of the noise scale's
            one-sided ``confidence`` interval, and the batch is chosen at that end: a
            sequential test, so that a large gain is taken as soon as the evidence shows
            it.
        candidates: Batch sizes on the geometric grid the acquisition is evaluated on
            (at most :data:`MAX_CANDIDATES`).
        beta: ``UpperConfidenceBound``'s exploration weight (on log goodput).
        windows_between: Windows at a batch size, after a change of it, before another
            change is considered. Before the first change one window at ``B0`` (the rank
            model's) is enough: the noise scale's sequential test is then the evidence.

    Raises:
        ValueError: Naming the argument, for values outside their ranges.
    """

    min_global_batch: int
    max_global_batch: int
    lr_rule: LrRule = "sqrt"
    min_gain: float = 0.02
    confidence: float = 0.95
    decay: float = 0.99
    min_noise_steps: int = 50
    candidates: int = 24
    beta: float = 1.0
    windows_between: int = 2

    def __post_init__(self) -> None:
        low, high = self.min_global_batch, self.max_global_batch
        if not (is_integer(low) and 1 <= low <= MAX_BATCH):
            raise ValueError(
                f"min_global_batch must be an integer in [1, {MAX_BATCH}], got {low!r}"
            )
        if not (is_integer(high) and low < high <= MAX_BATCH):
            raise ValueError(
                f"max_global_batch must be an integer in (min_global_batch, {MAX_BATCH}],"
                f" got {high!r}"
            )
        if self.lr_rule not in LR_RULES:
            raise ValueError(f"lr_rule must be one of {LR_RULES}, got {self.lr_rule!r}")
        if not (is_number(self.min_gain) and self.min_gain >= 0.0):
            raise ValueError(f"min_gain must be a finite number >= 0, got {self.min_gain!r}")
        if not (is_number(self.confidence) and 0.5 <= self.confidence < 1.0):
            raise ValueError(f"confidence must be in [0.5, 1), got {self.confidence!r}")
        if not (is_number(self.decay) and 0.0 <= self.decay < 1.0):
            raise ValueError(f"decay must be in [0, 1), got {self.decay!r}")
        if not (is_integer(self.min_noise_steps) and self.min_noise_steps >= 0):
            raise ValueError(
                f"min_noise_steps must be an integer >= 0, got {self.min_noise_steps!r}"
            )
        if not (is_integer(self.candidates) and 2 <= self.candidates <= MAX_CANDIDATES):
            raise ValueError(
                f"candidates must be an integer in [2, {MAX_CANDIDATES}], got {self.candidates!r}"
            )
        if not (is_number(self.beta) and self.beta >= 0.0):
            raise ValueError(f"beta must be a finite number >= 0, got {self.beta!r}")
        if not (is_integer(self.windows_between) and self.windows_between >= 1):
            raise ValueError(
                f"windows_between must be an integer >= 1, got {self.windows_between!r}"
            )


# a misspelt argument names the closest one (LightningCLI still sees the dataclass's fields)
GlobalBatchScaling.__init__ = keywords_checked(GlobalBatchScaling.__init__)  # type: ignore[method-assign]
