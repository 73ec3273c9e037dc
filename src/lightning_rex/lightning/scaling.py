"""Global batch scaling in training: per-step gradient norms and the learning-rate rule.

:class:`GradientNorms` measures what the noise-scale estimator needs
(:mod:`lightning_rex.core.scaling.noise_scale`), every optimizer step, on every rank:

* this rank's *local* squared gradient norm before DDP's all-reduce: a tensor hook on every
  parameter sees the gradient of this backward before it is accumulated (DDP reduces after
  accumulation); with gradient accumulation the local total is ``p.grad + grad`` (``no_sync``
  steps leave ``p.grad`` local), so the last backward of a step sees the whole local sum;
* the *global* squared norm of the all-reduced gradient, from ``p.grad`` in
  ``on_before_optimizer_step`` (Lightning has unscaled AMP gradients by then; the local norm
  is divided by the loss scale squared);
* both are turned into norms of *mean* gradients, undoing REX's loss factor
  (:func:`~lightning_rex.data.weighting.loss_scale`), and ``sum_r (b_r / B) |g_r|^2`` is one
  scalar all-reduce.

:class:`LearningRate` multiplies every optimizer's learning rates by the rule's factor when
it changes (``new factor / old factor``): when the global batch in force changes, and for
AdaScale every step, as its gain follows the noise estimates. Schedulers that update the
rate multiplicatively (``StepLR``, ``ExponentialLR``, warm-up chains) keep working on top of
it; a scheduler that sets the rate in closed form overrides it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_rex.core.saved import StateError, field, real, whole
from lightning_rex.core.scaling.config import GlobalBatchScaling
from lightning_rex.core.scaling.noise_scale import LR_RULES, NoiseScale, lr_factor
from lightning_rex.data.weighting import LossReduction, loss_scale

__all__ = [
    "GradientNorms",
    "LearningRate",
    "TrainingScaling",
    "amp_scales",
    "setup_scaling",
    "unscale_rates",
]


class GradientNorms:
    """Local (pre all-reduce) and global squared gradient norms of every optimizer step.

    Args:
        parameters: The module's parameters (those with ``requires_grad`` are hooked).
    """

    def __init__(self, parameters: Sequence[Tensor]) -> None:
        self._params = [p for p in parameters if p.requires_grad]
        self._local: dict[int, Tensor] = {}
        self._handles = [p.register_hook(self._hook(i, p)) for i, p in enumerate(self._params)]

    def _hook(self, i: int, p: Tensor) -> Callable[[Tensor], None]:
        def hook(grad: Tensor) -> None:
            with torch.no_grad():
                total = grad if p.grad is None else p.grad + grad
                self._local[i] = total.detach().float().pow(2).sum()

        return hook

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def read(
        self,
        sizes: Sequence[int],
        rank: int,
        reduction: LossReduction,
        amp_scale: float = 1.0,
        all_reduce: Callable[[Tensor], Tensor] | None = None,
        usable: bool = True,
        global_scale: float = 1.0,
    ) -> tuple[float, float]:
        """This step's ``(sum_r (b_r / B) |g_r|^2, |g|^2)`` of mean gradients, then reset.

        Call after the all-reduce (``on_before_optimizer_step``), on every rank.

        Args:
            sizes: The step's plan.
            rank: This rank.
            reduction: The loss's reduction over the micro-batch.
            amp_scale: The loss scale the local gradients carry (AMP), else 1.
            all_reduce: Sums a scalar tensor over ranks (None: one process).
            usable: False to leave the step out (NaN) while still taking part in the
                all-reduce (an epoch's final partial batch under accumulation).
            global_scale: The loss scale ``p.grad`` still carries (an optimizer that
                unscales itself under AMP), else 1.

        Returns:
            The two norms, NaN when a gradient was not finite, no backward reached the
            hooks (a skipped ``training_step``), or the step is not usable.
        """
        global_batch, num_ranks = float(sum(sizes)), len(sizes)
        dev = self._params[0].device if self._params else torch.device("cpu")
        weighted = torch.full((), math.nan, device=dev, dtype=torch.float32)
        error: BaseException | None = None
        try:
            if usable and self._local:
                factor = loss_scale(sizes, rank, reduction) * amp_scale
                if reduction == "sum":
                    factor *= sizes[rank]
                local = torch.zeros((), device=dev, dtype=torch.float32)
                for param_sq in self._local.values():
                    local = local + param_sq.to(dev)
                weighted = local / (factor * factor) * (sizes[rank] / global_batch)
        except Exception as err:  # the all-reduce below must happen on every rank anyway
            error = err
        self._local = {}
        if all_reduce is not None and num_ranks > 1:
            weighted = all_reduce(weighted)
        if error is not None:
            raise error
        glob = torch.zeros((), device=dev, dtype=torch.float32)
        for param in self._params:
            if param.grad is not None:
                glob = glob + param.grad.detach().float().pow(2).sum()
        if reduction == "sum":
            glob = glob / (global_batch * global_batch)
        glob = glob / (global_scale * global_scale)
        weighted_local_sq, global_sq = float(weighted), float(glob)
        return (weighted_local_sq if math.isfinite(weighted_local_sq) else math.nan), (
            global_sq if math.isfinite(global_sq) else math.nan
        )


class LearningRate:
    """Scale the optimizers' learning rates by a factor that follows the global batch."""

    def __init__(self) -> None:
        self.factor = 1.0

    def apply(self, optimizers: Sequence[Any], factor: float) -> bool:
        """Move every param group's ``lr`` from the current factor to ``factor``.

        Args:
            optimizers: The optimizers (``trainer.optimizers``).
            factor: The rule's factor for the global batch now in force.

        Returns:
            Whether the rates changed.
        """
        if not math.isfinite(factor) or factor <= 0 or factor == self.factor:
            return False
        ratio = factor / self.factor
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["lr"] * ratio
        self.factor = float(factor)
        return True


class TrainingScaling:
    """What one rank does for global batch scaling: norms every step, the rate at a change.

    Every rank keeps its own noise-scale averages (their inputs are all-reduced, so they
    agree) for the learning-rate rule; rank 0 also feeds the decider's scaler.

    Attributes:
        iterations: Scale-invariant iterations so far (AdaScale's gains summed; steps under
            the other rules).

    Args:
        config: The scaling settings.
        base_batch: The run's first global batch ``B0``.
        parameters: The module's parameters.
        saved: This object's :meth:`state_dict` from a checkpoint, or None.
    """

    def __init__(
        self,
        config: GlobalBatchScaling,
        base_batch: int,
        parameters: Sequence[Tensor],
        saved: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.base_batch = int(base_batch)
        self.norms = GradientNorms(parameters)
        self.rate = LearningRate()
        self.noise = NoiseScale(config.decay)
        self.batch = self.base_batch
        self.iterations = 0.0
        if saved:
            checked = self.check_state(saved, config)
            self.rate.factor = checked["lr_factor"]
            self.noise.load_state_dict(checked["noise"])
            self.batch = checked["batch"]
            self.iterations = checked["iterations"]

    @staticmethod
    def check_state(d: Any, config: GlobalBatchScaling | None) -> dict[str, Any]:
        """Check a saved state before anything is trained on it (every rank, alike).

        The learning-rate factor is already in the checkpoint's optimizer rates; a factor
        that is not the rule's at the saved batch (or, for AdaScale, outside ``[1, B/B0]``)
        would silently scale every later rate, so it is refused.

        Args:
            d: A dictionary from :meth:`state_dict`.
            config: This run's scaling settings (the saved batch must be in its range), or
                None when this run does not scale.

        Returns:
            The state, normalised: ``lr_factor``, ``batch``, ``noise`` (checked).

        Raises:
            StateError: Naming the field.
        """
        name = "batch_scaling"
        if not isinstance(d, dict):
            raise StateError(name, f"must be a mapping, got {type(d).__name__}")
        low, high = (
            (1, None) if config is None else (config.min_global_batch, config.max_global_batch)
        )
        batch = whole(field(d, "batch", name), f"{name}.batch", low, high)
        factor = real(field(d, "lr_factor", name), f"{name}.lr_factor", positive=True)
        base = d.get("base_batch")
        rule = d.get("lr_rule")
        if base is not None and rule is not None:  # both saved since they were kept
            base = whole(base, f"{name}.base_batch", 1)
            if rule not in LR_RULES:
                raise StateError(f"{name}.lr_rule", f"must be one of {LR_RULES}, got {rule!r}")
            ratio = batch / base
            if rule == "adascale":  # the gain lies between 1 and B / B0
                valid = min(1.0, ratio) * (1 - 1e-9) <= factor <= max(1.0, ratio) * (1 + 1e-9)
                want = f"between 1 and {ratio:.6g}"
            else:
                valid = math.isclose(factor, lr_factor(rule, batch, base), rel_tol=1e-9)
                want = f"{lr_factor(rule, batch, base):.6g}"
            if not valid:
                raise StateError(
                    f"{name}.lr_factor",
                    f"is {factor!r}, but the {rule} rule gives {want} at a global batch of "
                    f"{batch} from {base}",
                )
        elif config is not None and not 0 < factor <= high / low:  # type: ignore[operator]
            raise StateError(
                f"{name}.lr_factor",
                f"must be in (0, {high}/{low}] for the range, got {factor!r}",
            )
        iterations = real(d.get("iterations", 0.0), f"{name}.iterations")
        if iterations < 0:
            raise StateError(f"{name}.iterations", f"must be >= 0, got {iterations!r}")
        return {
            "lr_factor": factor,
            "batch": batch,
            "noise": NoiseScale.check_state(field(d, "noise", name), f"{name}.noise"),
            "iterations": iterations,  # older checkpoints have none: from 0
        }

    def after_backward(
        self,
        sizes: Sequence[int],
        rank: int,
        reduction: LossReduction,
        amp_scale: float,
        all_reduce: Callable[[Tensor], Tensor],
        feed: Callable[[float, float, Sequence[int]], Any] | None,
        usable: bool = True,
        global_scale: float = 1.0,
    ) -> None:
        """Read this step's norms (one all-reduce on every rank) and update the averages.

        Args:
            sizes: The step's plan.
            rank: This rank.
            reduction: The loss's reduction.
            amp_scale: The loss scale of the local gradients (1 without AMP).
            all_reduce: Sums a scalar over ranks.
            feed: Rank 0's decider's ``add_gradient_norms``, or None.
            usable: False to leave the step out (see :meth:`GradientNorms.read`).
            global_scale: The loss scale ``p.grad`` still carries, else 1.
        """
        weighted_local_sq, global_sq = self.norms.read(
            sizes, rank, reduction, amp_scale, all_reduce, usable, global_scale
        )
        self.noise.update(weighted_local_sq, global_sq, sizes)
        if feed is not None:
            feed(weighted_local_sq, global_sq, sizes)

    def at_step_start(self, optimizers: Sequence[Any], plan: Sequence[int]) -> bool:
        """Follow the global batch in force with the learning rate.

        Args:
            optimizers: The trainer's optimizers.
            plan: The plan of the step about to run.

        AdaScale's gain is recomputed every step, as AdaScale does: it moves with the noise
        estimates (the noise scale typically grows as training proceeds). The other rules
        change the rate only when the global batch does.

        Every step also advances :attr:`iterations`: by AdaScale's gain under
        ``"adascale"`` (the schedule of a step-interval scheduler then advances by the gain,
        :mod:`lightning_rex.lightning.schedules`), by one under the other rules.

        Returns:
            Whether the global batch changed and the rate with it.
        """
        global_batch = sum(plan)
        changed = global_batch != self.batch
        moved = False
        if changed or self.config.lr_rule == "adascale":
            grad_sq = 1.0 if self.noise.grad_sq is None else self.noise.grad_sq
            noise = 0.0 if self.noise.noise is None else self.noise.noise
            self.batch = global_batch
            factor = lr_factor(self.config.lr_rule, global_batch, self.base_batch, grad_sq, noise)
            moved = self.rate.apply(optimizers, factor)
        # AdaScale's scale-invariant iterations: this step counts for its gain
        self.iterations += self.rate.factor if self.config.lr_rule == "adascale" else 1.0
        return moved and changed

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state (the factor already in the optimizers' rates, the averages)."""
        return {
            "lr_factor": self.rate.factor,
            "noise": self.noise.state_dict(),
            "batch": self.batch,
            "base_batch": self.base_batch,
            "lr_rule": self.config.lr_rule,
            "iterations": self.iterations,
        }


def setup_scaling(cfg: GlobalBatchScaling, trainer: Any, pl_module: Any) -> None:
    """Check that a fit can scale its global batch, and give the strategy the range.

    Args:
        cfg: The scaling settings.
        trainer: The Trainer (its strategy gets ``batch_range``).
        pl_module: The LightningModule.

    Raises:
        ValueError: Naming what does not fit: not ``strategy="rex"``, manual optimization,
            one rank, or a range the micro-batch bounds cannot hold.
    """
    from lightning_rex.lightning.interfaces import UnevenStrategy

    strategy = trainer.strategy
    if not isinstance(strategy, UnevenStrategy):
        raise ValueError(
            "RexCallback(global_batch=...) needs strategy='rex': plain DDP cannot change "
            "the global batch"
        )
    if not pl_module.automatic_optimization:
        raise ValueError(
            "RexCallback(global_batch=...) needs automatic optimization: the noise scale is "
            "measured at the optimizer step"
        )
    if trainer.world_size < 2:
        raise ValueError(
            "RexCallback(global_batch=...) needs at least 2 ranks: the gradient noise scale "
            "is estimated from the ranks' local gradients against the global one"
        )
    if cfg.min_global_batch < trainer.world_size:
        raise ValueError(
            f"min_global_batch={cfg.min_global_batch} is below the world size "
            f"{trainer.world_size}: every rank needs a sample"
        )
    # the micro-batch bounds must hold both ends of the range
    for name, global_batch in (
        ("min_global_batch", cfg.min_global_batch),
        ("max_global_batch", cfg.max_global_batch),
    ):
        try:
            strategy.bounds.check_feasible(global_batch, trainer.world_size)
        except ValueError as err:
            raise ValueError(f"GlobalBatchScaling.{name}={global_batch}: {err}") from None
    strategy.batch_range = (cfg.min_global_batch, cfg.max_global_batch)


def unscale_rates(optimizers: Sequence[Any], factor: float) -> None:
    """Global batch scaling is off in this run and was on in its checkpoint: base rates.

    The checkpoint's learning rates carry the scaler's factor; they are divided by it, with
    a warning, so that the run trains at its base rates for its base global batch.

    Args:
        optimizers: The trainer's optimizers (their rates as restored).
        factor: The saved factor (checked).
    """
    from lightning.pytorch.utilities import rank_zero_warn

    if factor == 1.0:
        return
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["lr"] / factor
    rank_zero_warn(
        f"RexCallback: the checkpoint's learning rates carry global batch scaling's factor "
        f"x{factor:.4g}; scaling is off in this run, so they are divided by it (the base "
        "rates, for the base global batch this run trains at)"
    )


def amp_scales(strategy: Any, optimizer: Any) -> tuple[float, float]:
    """The AMP loss scale the local gradients carry, and the one ``p.grad`` still carries.

    Lightning unscales ``p.grad`` before ``on_before_optimizer_step``, except for an
    optimizer that unscales itself (fused), which is stepped with ``p.grad`` still scaled.

    Args:
        strategy: The Trainer's strategy (its precision plugin holds the scaler).
        optimizer: The optimizer being stepped.

    Returns:
        ``(local scale, global scale)``; ``(1, 1)`` without AMP.
    """
    scaler = getattr(getattr(strategy, "precision_plugin", None), "scaler", None)
    amp = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
    fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False))
    return amp, (amp if amp != 1.0 and fused else 1.0)
