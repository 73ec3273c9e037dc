"""One fit's REX work on one rank: what :class:`~lightning_rex.RexCallback` forwards to.

A :class:`FitSession` is built when a fit's training starts (the train loader, and so the
plan schedule, exists by then) and holds everything that lives for that fit: the window
driver (the loop the simulator runs too), this rank's compute timer, memory bound and NVML
telemetry, the decision log, global batch scaling's gradient norms and learning rate, the
hang watchdog and the preemption signals' handlers. It supplies what only Lightning knows
(the step, the device, the loggers) to the driver through its two protocols: the collectives (over
``torch.distributed``) and the plan target (the strategy's sampler). With a strategy that is
not an :class:`~lightning_rex.lightning.interfaces.UnevenStrategy` (plain ``ddp``) the plan
target is a frozen schedule and the session only monitors.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_rex.core import build
from lightning_rex.core.checks import is_number
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import PlanSchedule, SizeBounds
from lightning_rex.core.scaling.scaling_decider import ScalingDecider
from lightning_rex.core.settings import DecisionSettings
from lightning_rex.driver.config import LoopConfig
from lightning_rex.driver.exchange import ExchangeMessage
from lightning_rex.driver.loop import WindowDriver
from lightning_rex.driver.protocols import Decider, PlanTarget, ScheduleTarget
from lightning_rex.driver.records import DecisionLog, decision_line, window_metrics
from lightning_rex.lightning.collectives import driver_collectives
from lightning_rex.lightning.guards import FitGuards
from lightning_rex.lightning.interfaces import UnevenStrategy
from lightning_rex.lightning.preemption import preempt
from lightning_rex.lightning.progress import fraction_done, is_logging_step, is_step_end, steps_done
from lightning_rex.lightning.scaling import TrainingScaling, amp_scales, unscale_rates
from lightning_rex.lightning.schedules import unwrap_schedulers, wrap_schedulers
from lightning_rex.measure.telemetry import GpuTelemetry, MemoryBound, device_key
from lightning_rex.measure.timing import ComputeTimer

__all__ = ["DECISIONS", "FitSession", "SessionOptions", "StepTimeFn"]

DECISIONS = logging.getLogger("lightning.pytorch.lightning_rex")
"""Where the decision lines go: a child of Lightning's logger, so they print with its
messages, and a script that silences Lightning can keep them
(``logging.getLogger("lightning.pytorch.lightning_rex").setLevel(logging.INFO)``)."""

StepTimeFn = Callable[[int, int, int], float]
"""``fn(rank, step, micro_batch) -> seconds``: injected step times (tests and replays)."""


@dataclass(frozen=True)
class SessionOptions:
    """What a session takes from the callback's configuration.

    Attributes:
        settings: The decision parameters.
        loop: The window loop's settings (whether it applies plans is the strategy's call);
            its window is ``settings.window``, the same object.
        max_growth: The memory bound's growth factor (> 1).
        log_dir: Where the decision log goes (None: the Trainer's log directory).
        hang_timeout: The hang watchdog's floor in seconds (> 0; None: off).
        hang_factor: The watchdog's multiple of the typical step (>= 1).
        step_time_fn: Injected step times, in place of measurements (tests, replays).
        prior: Rates per device identity for a fresh fit's first plan, or None.
        verbose: Print one line per decision that is not a hold, on rank 0.
        preemption: Carry SIGTERM and SLURM's requeue signal to every rank through the
            next exchange, then checkpoint every rank at one step and stop
            (:mod:`~lightning_rex.lightning.preemption`); False leaves Lightning's handlers.

    Raises:
        ValueError: Naming the argument, for a value outside its range, or a loop whose
            window is not the settings' own.
    """

    settings: DecisionSettings
    loop: LoopConfig
    max_growth: float
    log_dir: str | None
    hang_timeout: float | None
    hang_factor: float
    step_time_fn: StepTimeFn | None = None
    prior: dict[str, list[float]] | None = None
    verbose: bool = True
    preemption: bool = True

    def __post_init__(self) -> None:
        if self.loop.window is not self.settings.window:
            raise ValueError("the loop and the decision settings must share one WindowSpec")
        if not (is_number(self.max_growth) and self.max_growth > 1.0):
            raise ValueError(f"max_growth must be > 1, got {self.max_growth}")
        timeout = self.hang_timeout
        if timeout is not None and not (is_number(timeout) and timeout > 0):
            raise ValueError(f"hang_timeout must be seconds > 0 or None, got {timeout!r}")
        if not (is_number(self.hang_factor) and self.hang_factor >= 1):
            raise ValueError(f"hang_factor must be a number >= 1, got {self.hang_factor!r}")
        if not isinstance(self.verbose, bool):
            raise ValueError(f"verbose must be True or False, got {self.verbose!r}")
        if not isinstance(self.preemption, bool):
            raise ValueError(f"preemption must be True or False, got {self.preemption!r}")


class FitSession:
    """One fit on one rank (see the module docstring); built by the callback.

    Args:
        options: The callback's options.
        trainer: The Trainer.
        module: The LightningModule.
        target: The plan target (the strategy's sampler, or a frozen schedule).
        adaptive: Whether plans are applied (False: monitor-only).
    """

    def __init__(
        self,
        options: SessionOptions,
        trainer: pl.Trainer,
        module: pl.LightningModule,
        target: PlanTarget,
        adaptive: bool,
    ) -> None:
        self.options, self.trainer, self.target = options, trainer, target
        self.strategy = trainer.strategy if isinstance(trainer.strategy, UnevenStrategy) else None
        device = trainer.strategy.root_device
        self.timer = ComputeTimer(device)
        self.telemetry = GpuTelemetry(device)
        # the memory bound is a pass cap (soft: a larger micro-batch runs as accumulation
        # passes); the user's max_micro_batch_size is the plans' hard bound, not this
        self.memory = MemoryBound(device, None, options.max_growth)
        # trainer.log_dir broadcasts from rank 0: every rank must ask for it
        self.dir = options.log_dir or trainer.log_dir or trainer.default_root_dir
        self.log: DecisionLog | None = None
        self._metrics: dict[str, float] = {}  # the latest record's, until a logging step
        self.step, self.comparable, self.started = 0, True, False
        self._injected_s = 0.0
        self.micro: list[int] = []
        self.driver = WindowDriver(
            replace(options.loop, apply_plans=adaptive),
            driver_collectives(device),
            target,
            self._decider,
            check_decider_state=lambda d, b, n: build.check_decider_state(
                options.settings, d, b, n
            ),
            resolve=self.timer.window_row,
            caps=self._caps,
            telemetry=self._sample_telemetry if device.type == "cuda" else None,
            on_record=self._write,
            on_exchange=self._progress,
            # injected step times run on their own clock: the wall clock of a test would add
            # the machine's load to every window's time outside compute
            clock=time.perf_counter if options.step_time_fn is None else self._injected_clock,
        )
        self.timer.attach_to(module)
        self.scaling: TrainingScaling | None = None
        self.guards = FitGuards(options.hang_timeout, options.hang_factor, options.preemption)

    @classmethod
    def open(
        cls, options: SessionOptions, trainer: pl.Trainer, module: pl.LightningModule
    ) -> FitSession | None:
        """A session for the fit, or None when it cannot be monitored (no batch size).

        Args:
            options: The callback's options.
            trainer: The Trainer.
            module: The LightningModule.

        Returns:
            The session, not yet started.
        """
        strategy = trainer.strategy
        target = strategy.plan_target if isinstance(strategy, UnevenStrategy) else None
        adaptive = target is not None and isinstance(strategy, UnevenStrategy) and strategy.adaptive
        if target is None:
            size = getattr(trainer.train_dataloader, "batch_size", None)  # any user loader
            if size is None:
                rank_zero_warn("RexCallback: the train loader has no batch_size; monitoring is off")
                return None
            ranks = trainer.world_size
            target = ScheduleTarget(
                PlanSchedule((int(size),) * ranks, int(size) * ranks), frozen=True
            )
        return cls(options, trainer, module, target, adaptive)

    def _injected_clock(self) -> float:
        """Seconds of injected step times so far (the driver's clock when times are injected)."""
        return self._injected_s

    # ------------------------------------------------------------------ start
    def start(self, module: pl.LightningModule, loaded: dict[str, Any] | None) -> None:
        """Every rank, before any batch is trained: scaling, the loop, the watchdog.

        A mid-epoch resume's step count is one behind here (Lightning advances it when the
        epoch loop restarts): the warm-up of a resume on another world size is one step
        short, and the first plan is scheduled from the first step no rank has fetched.

        Args:
            module: The LightningModule.
            loaded: The callback's state from a checkpoint, or None.
        """
        cfg, trainer, sched = (
            self.options.settings.global_batch,
            self.trainer,
            self.target.plan_schedule,
        )
        saved = (loaded or {}).get("batch_scaling")
        if cfg is not None and self.driver.config.apply_plans:
            params = list(module.parameters())
            self.scaling = TrainingScaling(cfg, sched.global_batch, params, saved)
            wrap_schedulers(trainer.lr_scheduler_configs, self.scaling)
        elif saved is not None:
            unscale_rates(trainer.optimizers, TrainingScaling.check_state(saved, None)["lr_factor"])
        self.started = True
        key = "cuda" if trainer.strategy.root_device.type == "cuda" else "cpu"
        with self.driver.guard("reading the device's identity"):
            key = device_key(trainer.strategy.root_device, self.telemetry)
        self.driver.start(steps_done(trainer), [key], loaded, self.options.prior)
        if loaded and self.driver.continued is False:
            resumed = self.target.resumed
            why = (resumed.reason if resumed is not None else "") or (
                f"the checkpoint was made with {loaded.get('world_size')} ranks and a global "
                f"batch of {loaded.get('global_batch')}, this run has {sched.world_size} and "
                f"{sched.global_batch}"
            )
            rank_zero_warn(
                f"RexCallback: {why}; the rest of the epoch is cut at this run's global batch "
                f"from the first sample not yet trained, and the controller starts afresh from "
                f"the plan {sched.plan_at(self.driver.measuring_from)} (rates known per device: "
                f"{sorted(loaded.get('device_rates', {}))})"
            )
        self.guards.start(trainer, self.driver.run_id, self.driver.stops)

    def _decider(self, plan: Plan, bounds: SizeBounds) -> Decider:
        keys = list(self.driver.device_keys)
        devices = [str(k) for k in keys] if len(keys) == len(plan) else None
        return build.build_decider(
            self.options.settings, plan, self.target.plan_schedule.global_batch, bounds, devices
        )

    # ------------------------------------------------------------------ per step
    def batch_start(self) -> None:
        """Start timing this rank's compute (and follow the global batch with the rate)."""
        trainer = self.trainer
        self.guards.advance()
        if not self.started:
            return
        stop = self.driver.stops.agreed
        if stop is not None:  # every rank, at the first batch after the exchange agreed it
            preempt(trainer, stop)
        # what every rank must agree on is computed from shared state, outside any guard
        if not self.micro:
            self.step = steps_done(trainer)
            self.comparable = True
        plan = self.target.plan_schedule.plan_at(self.step)
        scaling = self.scaling
        if (
            scaling is not None
            and not self.micro
            and scaling.at_step_start(trainer.optimizers, plan)
        ):
            rank_zero_info(
                f"lightning-rex: global batch {sum(plan)} from step {self.step}; learning rate "
                f"x{scaling.rate.factor:.3f} of the base ({scaling.config.lr_rule} rule)"
            )
        sizes = None if self.strategy is None else self.strategy.current_batch_sizes()
        if sizes is not None and sizes != plan:
            self.comparable = False  # the epoch's final partial batch: not comparable
        self.micro.append((plan if sizes is None else sizes)[trainer.global_rank])
        with self.driver.guard("starting the step timer"):
            if len(self.micro) == 1:
                self.memory.step_start()
            self.timer.start()

    def before_backward(self) -> None:
        """The hang watchdog: this rank reached its backward (and so its collectives)."""
        self.guards.backward()

    def batch_end(self) -> None:
        """Close the micro-batch; at the end of a step, hand its sample to the driver."""
        self.guards.advance(step_end=True)
        if not self.started:
            return
        with self.driver.guard("stopping the step timer"):
            self.timer.stop()
        if not is_step_end(self.trainer):
            return  # accumulating: the step is not done yet
        micro, self.micro = self.micro, []
        sample: Any = float("nan")
        step_time_fn = self.options.step_time_fn
        with self.driver.guard("closing the step's measurement"):
            sample = self.timer.take_step()
            self.memory.step_end(max((p for b in micro for p in self._passes(b)), default=0))
            if step_time_fn is not None:
                sample = sum(step_time_fn(self.trainer.global_rank, self.step, b) for b in micro)
                if math.isfinite(sample) and sample > 0:
                    self._injected_s += float(sample)
        self.driver.record(self.step, [sample], self.comparable)
        decider = self.driver.decider
        if isinstance(decider, ScalingDecider):  # what remains of the run prices a trial
            with self.driver.guard("reading the fit's progress"):
                decider.set_progress(fraction_done(self.trainer))
        if self._metrics and self.trainer.loggers and is_logging_step(self.trainer):
            # with the step's own metrics, in Lightning's record of the step (rank 0's values)
            metrics, self._metrics = self._metrics, {}
            self.trainer.lightning_module.log_dict(
                metrics, on_step=True, on_epoch=False, logger=True, rank_zero_only=True
            )

    def before_optimizer_step(self, optimizer: Any) -> None:
        """Global batch scaling: this step's gradient norms (one scalar all-reduce)."""
        if self.scaling is None or not self.started or self.strategy is None:
            return
        strategy = self.strategy
        plan = self.target.plan_schedule.plan_at(self.step)
        sizes = strategy.current_batch_sizes() or plan
        amp, global_scale = amp_scales(self.trainer.strategy, optimizer)
        decider = self.driver.decider
        feed = decider.add_gradient_norms if isinstance(decider, ScalingDecider) else None
        with self.driver.guard("measuring the gradient noise scale"):
            self.scaling.after_backward(
                sizes,
                self.trainer.global_rank,
                strategy.loss_reduction,
                amp,
                lambda t: self.trainer.strategy.reduce(t, reduce_op="sum"),
                feed,
                # the epoch's final partial batch: with accumulation its micro-batches had
                # other loss factors, so the step is left out (the all-reduce still happens)
                usable=tuple(sizes) == tuple(plan),
                global_scale=global_scale,
            )

    def end(self) -> None:
        """Agree that no rank failed (every rank, at the end of training)."""
        if self.started:
            self.guards.advance()  # a rank that never arrives is behind the others
            self.driver.finish()

    def release(self, watch_handlers: bool = False, on_error: bool = False) -> None:
        """Release the gradient hooks, the threads and the signal handlers (no collective).

        Args:
            watch_handlers: The fit is ending on an exception under a rex strategy: the
                watchdog and rex's signal handlers stay until :meth:`stop_watching`.
            on_error: The fit is ending on an exception.
        """
        self.guards.release(watch_handlers, on_error)
        self.timer.detach()
        if self.scaling is not None:
            self.scaling.norms.remove()
            unwrap_schedulers(self.trainer.lr_scheduler_configs)
        self.driver.close()

    def stop_watching(self, on_error: bool = False) -> None:
        """Stop the hang watchdog (the fit ended, or every exception handler has run).

        Args:
            on_error: The fit ended on an exception.
        """
        self.guards.stop_watching(on_error)

    def state_dict(self) -> dict[str, Any]:
        """The loop's state and global batch scaling's (every rank; one collective).

        Empty once the watchdog has found a silent rank: its peers are gone or stuck, so no
        collective is started (the checkpoint keeps the loader's position, which is exact).
        """
        if self.guards.error is not None:
            return {}
        self.guards.advance()  # around the gather: a rank that never arrives is behind
        state = self.driver.state_dict()
        self.guards.advance()
        if self.scaling is not None:
            state["batch_scaling"] = self.scaling.state_dict()
        return state

    # ------------------------------------------------------------------ what the driver asks
    def _passes(self, size: int) -> list[int]:
        return [size] if self.strategy is None else self.strategy.passes_for(size)

    def _caps(self) -> list[int | None]:
        """The pass cap this window's steps were split by; the measured one applies next."""
        strategy = self.strategy
        plan = self.target.plan_schedule.plan_at(self.step)
        mine = plan[self.trainer.global_rank]
        if strategy is None:
            return [self.memory.cap(mine)]
        used = strategy.pass_cap()
        strategy.set_memory_cap(self.memory.cap(max(self._passes(mine))))
        return [used]

    def _sample_telemetry(self) -> list[Any]:
        return [self.telemetry.sample()]

    def _write(self, record: dict[str, Any]) -> None:
        if self.log is None:
            self.log = DecisionLog(Path(self.dir), self.driver.run_id)
        if not self.log.write(record):
            return
        # the loggers get the latest window's scalars at Lightning's next logging step
        self._metrics = window_metrics(record)
        line = decision_line(record) if self.options.verbose else None
        if line is not None:  # rank 0 writes the records
            DECISIONS.info(line)

    def _progress(self, message: ExchangeMessage) -> None:
        trainer = self.trainer
        if trainer.progress_bar_callback is None or not message.decided:
            return
        # the progress bar keeps the last value, so once a window is enough
        trainer.lightning_module.log_dict(
            {
                "rex_imb%": 100.0 * message.imbalance,
                "rex_changes": float(self.target.plan_schedule.changes),
            },
            prog_bar=True,
            logger=False,
        )
