"""``RexCallback``: Lightning's hooks forwarded into one fit's session, and the configuration.

The callback holds no window logic and no per-fit state of its own: it validates its
arguments into :class:`~lightning_rex.core.settings.DecisionSettings` and a
:class:`~lightning_rex.driver.config.LoopConfig`, and at every fit's training start opens a
:class:`~lightning_rex.lightning.session.FitSession` (the window driver the simulator runs
too, this rank's timer, memory bound and telemetry, the decision log, global batch scaling
and the hang watchdog); every hook forwards to it. The decider is built by
:func:`~lightning_rex.core.build.build_decider`, as in the simulator.

With a plain ``ddp`` strategy, or ``RexStrategy(adaptive=False)``, the callback is
monitor-only: same measurements and tests; it logs the plan it would apply and the predicted
speedup, and changes nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, Checkpoint

from lightning_rex.core.checks import keywords_checked
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.scaling.config import GlobalBatchScaling
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.core.window_spec import WindowSpec
from lightning_rex.driver.config import LoopConfig
from lightning_rex.driver.loop import WindowDriver
from lightning_rex.driver.prior import PriorSource, load_prior
from lightning_rex.lightning.interfaces import ReportsHandledExceptions
from lightning_rex.lightning.scaling import setup_scaling
from lightning_rex.lightning.session import FitSession, SessionOptions, StepTimeFn

__all__ = ["RexCallback", "attach_default_callback", "exceptions_handled"]

_D, _L, _W = DecisionSettings(), LoopConfig(), WindowSpec()  # the defaults, written once


class RexCallback(Callback):
    """Adaptive per-rank micro-batch sizes for :class:`~lightning_rex.RexStrategy`.

    ``Trainer(strategy="rex")`` attaches one with the defaults; add it yourself to configure
    it. With ``strategy="ddp"`` it is monitor-only. One callback can serve several fits: each
    fit starts from a clean state (or from its checkpoint).

    Args:
        alpha: Family-wise significance level of the imbalance test, in (0, 1).
        window: Steps per observation window (>= 5).
        persistence: Consecutive imbalanced windows before a rescale (>= 1).
        min_effect: Practical effect threshold: a rank must be slower than the others by a
            median ratio above ``1 + min_effect`` (>= 0).
        max_growth: A rank's size may grow to at most this factor times the largest size it
            has already run, until that memory headroom is confirmed (CUDA; > 1).
        decision_lag: Steps between a gather (a window's or segment's end) and the exchange
            of its decision (the controller computes in the background meanwhile), and
            between polls for a decision not ready yet; default half a segment. Must be in
            [1, segment).
        looks: Looks per window (>= 1): every ``window // looks`` steps (a segment, >= 5) the
            step times are gathered and the controller looks at the window so far, acting
            before the window is whole when the evidence is already clear: a large slowdown,
            a new plan clearly within the margin or clearly worse (see docs/controller.md).
            1 gathers once per window. Default: up to 3, with segments of >= 10 steps (3 for
            the default window of 30, 1 for windows under 20).
        background: Run ``Controller.observe`` in a background thread on rank 0 (training
            never waits for it); False runs it inline at the window's end, so every
            decision lands on a step fixed in advance (deterministic, may stall).
        warmup: Steps at the start of a fit that are never measured (>= 0): the first step
            times lazy initialisation, ``torch.compile`` and cuDNN autotuning, not a rank's
            speed. Not applied again when resuming on the same world size.
        max_warmup: The most steps the warm-up may last (>= 0). After ``warmup`` steps it
            goes on while any rank's steps are still getting faster: a gathered block whose
            first half runs slower than its second by more than noise is dropped, and the
            next one judged (see docs/callback.md). ``max_warmup <= warmup``: a fixed count.
        seed: The controller's seed.
        pool_by_device: Ranks whose devices have the same identity (a GPU's name, or
            ``"cpu"``) share evidence in the time model: partial pooling, the device's
            curve times each rank's own level, for groups of 4 ranks or more (see
            docs/controller.md). False models every rank alone.
        log_dir: Where to write ``rex_decisions.jsonl``; default the Trainer's ``log_dir``
            (or ``default_root_dir`` without a logger).
        global_batch: Global batch scaling (opt-in, off by default): the global batch
            follows goodput within ``[min_global_batch, max_global_batch]``, each change
            validated, the learning rate following the chosen rule (see
            :class:`~lightning_rex.core.scaling.config.GlobalBatchScaling`). Needs
            ``strategy="rex"`` and automatic optimization.
        hang_timeout: The hang watchdog (on several ranks): when a rank makes no progress in
            its training steps for this many seconds, or ``hang_factor`` times the slowest
            rank's typical step if that is longer, while another rank is ahead of it, every
            rank raises a :class:`~lightning_rex.RexRankError` naming it and the run ends
            (see docs/callback.md). A pause every rank shares (validation, a checkpoint, a
            slow first step) is never counted. None turns it off. Default 600 s (NCCL's
            own timeout is 30 minutes).
        hang_factor: See ``hang_timeout`` (>= 1).
        prior: What is known of the devices before this fit, for a fresh fit's first plan
            instead of the even split: rates ``{device: [samples/s, overhead s]}``, a
            previous run's ``rex_decisions.jsonl`` (or its run directory), a profile from
            ``examples/profile_curve.py``, or a list of these (see
            :mod:`lightning_rex.driver.prior`). Used when every rank's device is in it
            (otherwise rank 0 warns at a fresh fit's start, naming the devices it lacks);
            read and checked when the callback is built, so a bad source (a malformed or
            non-finite value, an empty path, a profile whose time falls with the size, a
            file over its size limit) fails at once with a ``ValueError`` naming ``prior``,
            the file, the device and the value. A resumed fit keeps its checkpoint's plan.
        verbose: Print one line per decision on rank 0, through Lightning's logging (the
            ``lightning.pytorch.lightning_rex`` logger, at INFO, printed with Lightning's
            messages): the new plan and from which step, why, and the predicted gain; holds
            are not printed. False keeps the terminal quiet (every decision is still in
            ``rex_decisions.jsonl`` and the loggers).
        preemption: During the fit, SIGTERM (on any rank, or all) and, under SLURM's
            auto-requeue, its requeue signal are carried to every rank through the next
            exchange (no collective runs in a signal handler, so nothing deadlocks); every
            rank then saves one checkpoint at the same step (``hpc_ckpt_<n>.ckpt`` in the
            Trainer's ``default_root_dir``: SLURM resumes from it by itself, elsewhere
            ``ckpt_path="hpc"``), SLURM's job is requeued, and the fit stops with
            Lightning's ``SIGTERMException`` (exit code 0). See docs/howto/preemption.md.
            False leaves Lightning's own handlers.

    Raises:
        ValueError: For arguments outside the ranges above, naming the argument.
    """

    @keywords_checked
    def __init__(
        self,
        alpha: float = _D.alpha,
        window: int = _W.steps,
        persistence: int = _D.persistence,
        min_effect: float = _D.min_effect,
        max_growth: float = 2.0,
        decision_lag: int | None = None,
        background: bool = _L.background,
        warmup: int = _W.warmup,
        max_warmup: int = _W.max_warmup,
        seed: int = _D.seed,
        pool_by_device: bool = _D.pool_by_device,
        log_dir: str | None = None,
        looks: int | None = _W.looks,
        global_batch: GlobalBatchScaling | None = None,
        hang_timeout: float | None = 600.0,
        hang_factor: float = 20.0,
        prior: PriorSource | None = None,
        verbose: bool = True,
        preemption: bool = True,
    ) -> None:
        # one window object, for the loop and the controller's settings alike
        spec = WindowSpec(window, looks, warmup, max_warmup)
        self.loop = LoopConfig(spec, decision_lag, background)
        self.settings = DecisionSettings(
            alpha=alpha,
            min_effect=min_effect,
            persistence=persistence,
            seed=seed,
            window=spec,
            pool_by_device=pool_by_device,
            global_batch=global_batch,
        )
        self._options = SessionOptions(
            self.settings,
            self.loop,
            max_growth,
            log_dir,
            hang_timeout,
            hang_factor,
            prior=None if prior is None else load_prior(prior),
            verbose=verbose,
            preemption=preemption,
        )
        # tests and replays only: fn(rank, step, micro_batch) -> seconds replaces measurements
        self._step_time_fn: StepTimeFn | None = None
        self._loaded: dict[str, Any] | None = None
        self.session: FitSession | None = None

    # ------------------------------------------------------------------ configuration
    @property
    def window(self) -> int:
        """Steps per observation window."""
        return self.settings.window.steps

    @property
    def global_batch(self) -> GlobalBatchScaling | None:
        """Global batch scaling's settings, or None."""
        return self.settings.global_batch

    # ------------------------------------------------------------------ what it did
    @property
    def driver(self) -> WindowDriver | None:
        """This fit's window driver (None before training starts)."""
        return None if self.session is None else self.session.driver

    @property
    def adaptive(self) -> bool:
        """Whether this fit applies plans (False: monitor-only)."""
        return self.driver is not None and self.driver.config.apply_plans

    @property
    def records(self) -> list[dict[str, Any]]:
        """This fit's window records (rank 0; empty elsewhere)."""
        return [] if self.driver is None else self.driver.records

    @property
    def plan_history(self) -> list[tuple[int, Plan]]:
        """``(first step, plan)`` pairs of this fit's plan schedule (read from the sampler)."""
        return [] if self.session is None else self.session.target.plan_schedule.entries

    @property
    def plan_changes(self) -> int:
        """Plan changes in the schedule."""
        return 0 if self.session is None else self.session.target.plan_schedule.changes

    def options(self) -> SessionOptions:
        """What a session takes from this callback's configuration (a fit's, or a Fabric loop's).

        Returns:
            The options.
        """
        return replace(self._options, step_time_fn=self._step_time_fn)

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Start a fit from a clean state; give a scaling strategy its range of ``B``."""
        if stage != "fit":
            return
        self._release()
        self.session = None
        if self.global_batch is not None:
            setup_scaling(self.global_batch, trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Open the fit's session once the train loader (and so the plan schedule) exists."""
        self.session = FitSession.open(self.options(), trainer, pl_module)
        loaded, self._loaded = self._loaded, None
        if self.session is not None:
            self.session.start(pl_module, loaded)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Start timing this rank's compute."""
        if self.session is not None:
            self.session.batch_start()

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any
    ) -> None:
        """The hang watchdog: this rank reached its backward (and so its collectives)."""
        if self.session is not None:
            self.session.before_backward()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Close the micro-batch; at the end of a step, hand its sample to the driver."""
        if self.session is not None:
            self.session.batch_end()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        """Global batch scaling: this step's gradient norms (one scalar all-reduce)."""
        if self.session is not None:
            self.session.before_optimizer_step(optimizer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Agree that no rank failed, then release the hooks and the background thread."""
        try:
            if self.session is not None:
                self.session.end()
        finally:
            self._release()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Release the gradient hooks and the background thread (no collective).

        Under a rex strategy the hang watchdog goes on watching the other exception
        handlers (their collectives included) until the strategy has run them all
        (:meth:`exception_handled`); under another strategy it stops here.
        """
        if self.session is not None:
            watched = isinstance(trainer.strategy, ReportsHandledExceptions)
            self.session.release(watch_handlers=watched, on_error=True)

    def exception_handled(self) -> None:
        """Every ``on_exception`` hook has run (a rex strategy's own): stop watching for a hang."""
        if self.session is not None:
            self.session.stop_watching(on_error=True)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Release the gradient hooks and the background thread."""
        self._release()

    def _release(self) -> None:
        if self.session is not None:
            self.session.release()

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The window loop's state (see :mod:`lightning_rex.driver.checkpoint`).

        Called on every rank when Lightning dumps a checkpoint; it gathers the partial window
        (one collective), so every rank must save checkpoints together, as Lightning does.
        On rank 0 it first waits for the controller's background work (at most a
        hyperparameter fit or two), and saves the decisions not yet exchanged.

        Returns:
            A dictionary of plain Python values (empty outside a fit).
        """
        if self.session is None or not self.session.started:
            return dict(self._loaded or {})  # not started yet: what it was given, unchanged
        return self.session.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the state until the fit's session exists (``on_train_start``), which checks it.

        Args:
            state_dict: A dictionary from :meth:`state_dict`.
        """
        self._loaded = dict(state_dict) if state_dict else None


def attach_default_callback(callbacks: list[Callback]) -> None:
    """Insert a default :class:`RexCallback` into a Trainer's callbacks if none is there.

    It goes ahead of the checkpoint callbacks (which Lightning has already moved to the
    end), so that a checkpoint taken at a step holds the callback's state of that step.

    Args:
        callbacks: ``trainer.callbacks``, changed in place.
    """
    if not any(isinstance(c, RexCallback) for c in callbacks):
        checkpoints = (i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint))
        callbacks.insert(next(checkpoints, len(callbacks)), RexCallback())


def exceptions_handled(trainer: pl.Trainer | None) -> None:
    """Tell every :class:`RexCallback` of ``trainer`` that each ``on_exception`` hook ran.

    Args:
        trainer: The Trainer (None: there is nothing to tell).
    """
    callbacks: list[Callback] = [] if trainer is None else trainer.callbacks  # type: ignore[attr-defined]
    for callback in callbacks:
        if isinstance(callback, RexCallback):
            callback.exception_handled()
