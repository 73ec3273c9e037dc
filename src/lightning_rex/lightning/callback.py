"""``RexCallback``: Lightning's hooks forwarded into the window driver, plus logging.

The callback holds no window logic. Per step it times this rank's own compute
(:class:`~lightning_rex.measure.timing.ComputeTimer`) and hands the sample to a
:class:`~lightning_rex.driver.loop.WindowDriver`, the loop the simulator runs too; the driver
closes windows, runs :class:`~lightning_rex.core.controller.Controller` on rank 0, exchanges
its decisions at agreed steps and schedules plans in the strategy's sampler. The callback
supplies what only Lightning knows (the step, the device, the memory bound, NVML telemetry,
the loggers) through the driver's two protocols: the collectives (over ``torch.distributed``)
and the plan target (the strategy's sampler, which holds the plan schedule).

With a plain ``ddp`` strategy, or ``RexStrategy(adaptive=False)``, the callback is
monitor-only: same measurements and tests; it logs the plan it would apply and the predicted
speedup, and changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_rex.core.batch_scaling import BatchScaler, GlobalBatchScaling
from lightning_rex.core.controller import Controller
from lightning_rex.core.plan import Plan
from lightning_rex.core.scaling_decider import ScalingDecider
from lightning_rex.core.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.settings import default_looks
from lightning_rex.driver.exchange import ExchangeMessage
from lightning_rex.driver.loop import LoopConfig, WindowDriver
from lightning_rex.driver.protocols import PlanTarget, ScheduleTarget
from lightning_rex.driver.records import DecisionLog
from lightning_rex.lightning.collectives import device_key, driver_collectives
from lightning_rex.lightning.progress import is_step_end, steps_done
from lightning_rex.lightning.scaling import TrainingScaling, amp_scales, setup_scaling
from lightning_rex.lightning.watchdog import HangWatchdog, default_store
from lightning_rex.measure.telemetry import GpuTelemetry, MemoryBound
from lightning_rex.measure.timing import ComputeTimer

__all__ = ["RexCallback"]

StepTimeFn = Callable[[int, int, int], float]


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
        warmup: Steps at the start of a fit that are not measured (>= 0): the first steps
            time allocator warm-up, cuDNN autotuning or ``torch.compile``, not a rank's
            speed. Not applied again when resuming on the same world size.
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
            :class:`~lightning_rex.core.batch_scaling.GlobalBatchScaling`). Needs
            ``strategy="rex"`` and automatic optimization.
        hang_timeout: The hang watchdog (on several ranks): when a rank makes no progress in
            its training steps for this many seconds, or ``hang_factor`` times the slowest
            rank's typical step if that is longer, while another rank is ahead of it, every
            rank raises a :class:`~lightning_rex.RexRankError` naming it and the run ends
            (see docs/driver.md). None turns it off. Default 600 s (NCCL's own timeout is
            30 minutes).
        hang_factor: See ``hang_timeout`` (>= 1).

    Raises:
        ValueError: For arguments outside the ranges above, naming the argument.
    """

    def __init__(
        self,
        alpha: float = 0.01,
        window: int = 30,
        persistence: int = 2,
        min_effect: float = 0.05,
        max_growth: float = 2.0,
        decision_lag: int | None = None,
        background: bool = True,
        warmup: int = 10,
        seed: int = 0,
        pool_by_device: bool = True,
        log_dir: str | None = None,
        looks: int | None = None,
        global_batch: GlobalBatchScaling | None = None,
        hang_timeout: float | None = 600.0,
        hang_factor: float = 20.0,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if int(persistence) != persistence or persistence < 1:
            raise ValueError(f"persistence must be an integer >= 1 window, got {persistence}")
        if not min_effect >= 0.0:
            raise ValueError(f"min_effect must be >= 0, got {min_effect}")
        if not max_growth > 1.0:
            raise ValueError(f"max_growth must be > 1, got {max_growth}")
        # the loop these arguments give (whether it applies plans is the strategy's call, per fit)
        looks = default_looks(window) if looks is None else looks
        self.loop = LoopConfig(window, decision_lag, warmup, bool(background), looks=looks)
        self.looks = int(looks)
        self.alpha, self.window, self.persistence = float(alpha), int(window), int(persistence)
        self.min_effect, self.max_growth = float(min_effect), float(max_growth)
        self.decision_lag, self.background = self.loop.lag, bool(background)
        self.warmup, self.seed, self.log_dir = int(warmup), int(seed), log_dir
        self.pool_by_device = bool(pool_by_device)
        if global_batch is not None and not isinstance(global_batch, GlobalBatchScaling):
            raise ValueError(
                f"global_batch must be a GlobalBatchScaling or None, got {type(global_batch)}"
            )
        self.global_batch = global_batch
        if hang_timeout is not None and not (
            isinstance(hang_timeout, (int, float))
            and math.isfinite(hang_timeout)
            and hang_timeout > 0
        ):
            raise ValueError(f"hang_timeout must be seconds > 0 or None, got {hang_timeout!r}")
        if not (
            isinstance(hang_factor, (int, float))
            and math.isfinite(hang_factor)
            and hang_factor >= 1
        ):
            raise ValueError(f"hang_factor must be a number >= 1, got {hang_factor!r}")
        self.hang_timeout = None if hang_timeout is None else float(hang_timeout)
        self.hang_factor = float(hang_factor)
        # tests and replays only: fn(rank, step, micro_batch) -> seconds replaces measurements
        self._step_time_fn: StepTimeFn | None = None
        self._loaded: dict[str, Any] | None = None
        self._reset()

    def _reset(self) -> None:
        self.driver: WindowDriver | None = None
        self._target: PlanTarget | None = None
        self._timer: ComputeTimer | None = None
        self._memory: MemoryBound | None = None
        self._telemetry: GpuTelemetry | None = None
        self._log: DecisionLog | None = None
        self._trainer: pl.Trainer | None = None
        self._dir = "."
        self._step = 0
        self._micro: list[int] = []
        self._comparable = True
        self._started = False
        self._scaling: TrainingScaling | None = None
        self._watchdog: HangWatchdog | None = None

    # ------------------------------------------------------------------ what it did
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
        return [] if self._target is None else self._target.plan_schedule.entries

    @property
    def plan_changes(self) -> int:
        """Plan changes in the schedule."""
        return 0 if self._target is None else self._target.plan_schedule.changes

    # ------------------------------------------------------------------ set-up
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Start a fit from a clean state: timer, memory bound and telemetry for this rank."""
        if stage != "fit":
            return
        self._reset()
        self._trainer = trainer
        if self.global_batch is not None:
            setup_scaling(self.global_batch, trainer, pl_module)
        device = trainer.strategy.root_device
        self._timer = ComputeTimer(device)
        self._telemetry = GpuTelemetry(device)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Build the driver once the train loader (and so the plan schedule) exists."""
        strategy = trainer.strategy
        target: PlanTarget | None = getattr(strategy, "plan_target", None)
        adaptive = bool(getattr(strategy, "adaptive", False)) and target is not None
        if target is None:
            bs = getattr(trainer.train_dataloader, "batch_size", None)
            if bs is None:
                rank_zero_warn("RexCallback: the train loader has no batch_size; monitoring is off")
                return
            n = trainer.world_size
            target = ScheduleTarget(PlanSchedule((int(bs),) * n, int(bs) * n), frozen=True)
        assert self._timer is not None
        bounds = target.plan_schedule.bounds
        device = strategy.root_device
        self._memory = MemoryBound(device, bounds.max_size, self.max_growth)
        # trainer.log_dir broadcasts from rank 0: every rank must ask for it
        self._dir = self.log_dir or trainer.log_dir or trainer.default_root_dir
        config = LoopConfig(
            self.window,
            self.decision_lag,
            self.warmup,
            self.background,
            apply_plans=adaptive,
            looks=self.looks,
        )
        self._target = target
        self.driver = WindowDriver(
            config,
            driver_collectives(device),
            target,
            self._make_controller,
            check_decider_state=self._check_decider_state,
            resolve=self._resolve,
            caps=self._caps,
            telemetry=self._sample_telemetry if device.type == "cuda" else None,
            on_record=self._write,
            on_exchange=self._progress,
        )
        self._timer.attach(pl_module.parameters())
        saved = (self._loaded or {}).get("batch_scaling")
        if self.global_batch is not None and adaptive:
            self._scaling = TrainingScaling(
                self.global_batch,
                target.plan_schedule.global_batch,
                list(pl_module.parameters()),
                saved,
            )
        elif saved is not None:
            self._unscale_rates(trainer, TrainingScaling.check_state(saved, None)["lr_factor"])
        self._start(trainer)
        store = default_store() if trainer.world_size > 1 and self.hang_timeout else None
        if store is not None and self.hang_timeout is not None:
            self._watchdog = HangWatchdog(
                store,
                trainer.global_rank,
                trainer.world_size,
                self.driver.run_id,
                self.hang_timeout,
                self.hang_factor,
            )
            self._watchdog.start()

    @staticmethod
    def _unscale_rates(trainer: pl.Trainer, factor: float) -> None:
        """Global batch scaling is off now, on in the checkpoint: back to the base rates."""
        if factor == 1.0:
            return
        for opt in trainer.optimizers:
            for group in opt.param_groups:
                group["lr"] = group["lr"] / factor
        rank_zero_warn(
            f"RexCallback: the checkpoint's learning rates carry global batch scaling's factor "
            f"x{factor:.4g}; scaling is off in this run, so they are divided by it (the base "
            "rates, for the base global batch this run trains at)"
        )

    def _check_decider_state(self, d: Any, global_batch: int, world_size: int) -> Any:
        """Check a saved decider's state; None for another kind, which starts afresh."""
        scaling = isinstance(d, dict) and "scaler" in d
        if scaling != (self.global_batch is not None):
            rank_zero_warn(
                "RexCallback: global batch scaling is "
                f"{'off' if scaling else 'on'} in this run and was {'on' if scaling else 'off'}"
                " in the checkpoint's: the controller starts afresh"
            )
            return None
        if scaling:
            ScalingDecider.check_state(d, global_batch, world_size, self.global_batch)
        else:
            Controller.check_state(d, global_batch, world_size)
        return d

    def _start(self, trainer: pl.Trainer) -> None:
        """Start the loop (every rank, before any batch is trained).

        A mid-epoch resume's step count is one behind here (Lightning advances it when the
        epoch loop restarts): the warm-up of a resume on another world size is one step
        short, and the first plan is scheduled from the first step no rank has fetched.
        """
        assert self.driver is not None and self._target is not None
        self._started = True
        key = "cuda" if trainer.strategy.root_device.type == "cuda" else "cpu"
        with self.driver.guard("reading the device's identity"):
            key = device_key(trainer.strategy.root_device, self._telemetry)
        loaded, self._loaded = self._loaded, None
        step = steps_done(trainer)
        self.driver.start(step, [key], loaded)
        sched = self._target.plan_schedule
        if loaded and self.driver.continued is False:
            resumed = self._target.resumed
            saved = loaded.get("world_size"), loaded.get("global_batch")
            why = (resumed.reason if resumed is not None else "") or (
                f"the checkpoint was made with {saved[0]} ranks and a global batch of "
                f"{saved[1]}, this run has {sched.world_size} and {sched.global_batch}"
            )
            plan = sched.plan_at(self.driver.measuring_from)
            rank_zero_warn(
                f"RexCallback: {why}; the rest of the epoch is cut at this run's global batch "
                f"from the first sample not yet trained, and the controller starts afresh from "
                f"the plan {plan} (rates known per device: "
                f"{sorted(loaded.get('device_rates', {}))})"
            )

    def _make_controller(self, plan: Plan, bounds: SizeBounds) -> Controller | ScalingDecider:
        cfg = self.global_batch
        base = self._target.plan_schedule.global_batch if self._target is not None else sum(plan)
        controller = Controller(
            base,
            len(plan),
            alpha=self.alpha,
            min_effect=self.min_effect,
            persistence=self.persistence,
            min_size=bounds.min_size,
            max_sizes=bounds.caps(len(plan)),
            seed=self.seed,
            initial_plan=plan if sum(plan) == base else None,
            groups=self._device_groups(len(plan)),
            looks=self.looks,
            window_steps=self.window,
            max_global_batch=None if cfg is None else cfg.max_global_batch,
        )
        if sum(plan) != base:  # resuming at a batch the scaler moved to
            controller.set_global_batch(sum(plan), plan)
        if cfg is None:
            return controller
        return ScalingDecider(controller, BatchScaler(cfg, base, len(plan)), self.window)

    def _device_groups(self, n: int) -> list[str | None] | None:
        """Every rank's device identity, as the driver gathered it, when pooling is on."""
        keys = list(self.driver.device_keys) if self.driver is not None else []
        return [str(k) for k in keys] if self.pool_by_device and len(keys) == n else None

    # ------------------------------------------------------------------ per step
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Start timing this rank's compute."""
        if self._watchdog is not None:
            self._watchdog.advance()
        if self.driver is None or not self._started:
            return
        assert self._target is not None
        # what every rank must agree on is computed from shared state, outside any guard
        if not self._micro:
            self._step = steps_done(trainer)
            self._comparable = True
        plan = self._target.plan_schedule.plan_at(self._step)
        # every rank: the learning rate follows the global batch of the step about to run
        scaling = self._scaling
        if (
            scaling is not None
            and not self._micro
            and scaling.at_step_start(trainer.optimizers, plan)
        ):
            rank_zero_info(
                f"lightning-rex: global batch {sum(plan)} from step {self._step}; learning rate "
                f"x{scaling.rate.factor:.3f} of the base ({scaling.config.lr_rule} rule)"
            )
        sizes = getattr(trainer.strategy, "current_batch_sizes", lambda: None)()
        if sizes is not None and sizes != plan:
            self._comparable = False  # the epoch's final partial batch: not comparable
        self._micro.append((plan if sizes is None else sizes)[trainer.global_rank])
        with self.driver.guard("starting the step timer"):
            assert self._timer is not None and self._memory is not None
            if len(self._micro) == 1:
                self._memory.step_start()
            self._timer.start()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Close the micro-batch; at the end of a step, hand its sample to the driver."""
        if self._watchdog is not None:
            self._watchdog.advance(step_end=True)
        if self.driver is None or not self._started:
            return
        with self.driver.guard("stopping the step timer"):
            assert self._timer is not None
            self._timer.stop()
        if not is_step_end(trainer):
            return  # accumulating: the step is not done yet
        micro, self._micro = self._micro, []
        sample: Any = float("nan")
        with self.driver.guard("closing the step's measurement"):
            assert self._timer is not None and self._memory is not None
            sample = self._timer.take_step()
            self._memory.step_end(max(micro, default=0))
            if self._step_time_fn is not None:
                sample = sum(self._step_time_fn(trainer.global_rank, self._step, b) for b in micro)
        self.driver.record(self._step, [sample], self._comparable)

    def on_before_backward(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any
    ) -> None:
        """The hang watchdog: this rank reached its backward (and so its collectives)."""
        if self._watchdog is not None:
            self._watchdog.advance()

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        """Global batch scaling: this step's gradient norms (one scalar all-reduce)."""
        if self._scaling is None or self.driver is None or not self._started:
            return
        strategy = trainer.strategy
        assert self._target is not None
        plan = self._target.plan_schedule.plan_at(self._step)
        sizes = getattr(strategy, "current_batch_sizes", lambda: None)() or plan
        # the epoch's final partial batch: with accumulation its micro-batches had different
        # loss factors, so the step is left out (the all-reduce still happens)
        usable = tuple(sizes) == tuple(plan)
        amp, global_scale = amp_scales(strategy, optimizer)
        decider = self.driver.decider
        feed = decider.add_gradient_norms if isinstance(decider, ScalingDecider) else None
        with self.driver.guard("measuring the gradient noise scale"):
            self._scaling.after_backward(
                sizes,
                trainer.global_rank,
                getattr(strategy, "loss_reduction", "mean"),
                amp,
                lambda t: strategy.reduce(t, reduce_op="sum"),
                feed,
                usable=usable,
                global_scale=global_scale,
            )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Agree that no rank failed, then release the hooks and the background thread."""
        try:
            if self.driver is not None and self._started:
                self.driver.finish()
        finally:
            self._release()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Release the gradient hooks and the background thread (no collective)."""
        self._release()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Release the gradient hooks and the background thread."""
        self._release()

    def _release(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._timer is not None:
            self._timer.detach()
        if self._scaling is not None:
            self._scaling.norms.remove()
        if self.driver is not None:
            self.driver.close()

    # ------------------------------------------------------------------ what the driver asks
    def _resolve(self, samples: list[Any]) -> np.ndarray:
        assert self._timer is not None
        out = []
        for s in samples:
            x = s[0]
            out.append(float(x) if isinstance(x, (int, float)) else self._timer.resolve([x])[0])
        return np.asarray(out, dtype=np.float64)[None, :]

    def _caps(self) -> list[int | None]:
        assert self._memory is not None and self._target is not None and self._trainer is not None
        plan = self._target.plan_schedule.plan_at(self._step)
        return [self._memory.cap(plan[self._trainer.global_rank])]

    def _sample_telemetry(self) -> list[Any]:
        return [None if self._telemetry is None else self._telemetry.sample()]

    def _write(self, record: dict[str, Any]) -> None:
        assert self.driver is not None and self._trainer is not None
        if self._log is None:
            self._log = DecisionLog(Path(self._dir), self._trainer.loggers, self.driver.run_id)
        self._log.write(record, step=self._trainer.global_step)

    def _progress(self, message: ExchangeMessage) -> None:
        trainer = self._trainer
        if trainer is None or trainer.progress_bar_callback is None or not message.decided:
            return
        # the progress bar keeps the last value, so once a window is enough
        trainer.lightning_module.log_dict(
            {"rex_imb%": 100.0 * message.imbalance, "rex_changes": float(self.plan_changes)},
            prog_bar=True,
            logger=False,
        )

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The window loop's state (see :mod:`lightning_rex.driver.state`).

        Called on every rank when Lightning dumps a checkpoint; it gathers the partial window
        (one collective), so every rank must save checkpoints together, as Lightning does.
        On rank 0 it first waits for the controller's background work (at most a
        hyperparameter fit or two), and saves the decisions not yet exchanged.

        Returns:
            A dictionary of plain Python values (empty outside a fit).
        """
        if self.driver is None or not self._started:
            return dict(self._loaded or {})  # not started yet: what it was given, unchanged
        state = self.driver.state_dict()
        if self._scaling is not None:
            state["batch_scaling"] = self._scaling.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the state until the driver exists (``on_train_start``), which checks it.

        Args:
            state_dict: A dictionary from :meth:`state_dict`.
        """
        self._loaded = dict(state_dict) if state_dict else None
