"""``RexCallback``: measure every rank, run the controller, apply its plans, log everything.

The callback is a driver of :class:`lightning_rex.core.Controller`; it holds no controller
logic. Per optimizer step it records this rank's own compute time
(:class:`~lightning_rex.measure.timing.ComputeTimer`). Every ``window`` steps:

1. all ranks gather their samples (and their memory bound) in **one** collective;
2. rank 0 builds a :class:`~lightning_rex.core.window.Window` and hands it to
   ``Controller.observe``, in a background thread that only computes (no collective ever
   leaves it);
3. ``decision_lag`` steps later, on the training thread and at the same step on every rank,
   all ranks exchange "decision or none" (one small tensor broadcast from rank 0) and, if
   there is a plan, call ``strategy.set_plan(plan)`` together. Steps measured before the new
   plan is in force are not used, so every window is measured under one plan. A decision
   still being computed is not waited for: the exchange says "none" and polls again
   ``decision_lag`` steps later.

Every exchange step is agreed by all ranks in advance (a window's end plus ``decision_lag``,
or a poll that rank 0's previous broadcast announced), so the order of collectives is the
same on every rank. With ``background=False`` every decision is ready at its exchange and
runs are deterministic for given measurements; with the background thread, training never
stalls on the controller, and the step a decision lands on can vary with the host's load.

With a plain ``ddp`` strategy, or ``RexStrategy(adaptive=False)``, the callback is
monitor-only: same measurements and tests, it logs the plan it would apply and the predicted
speedup, and changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn

from lightning_rex.core.controller import Controller
from lightning_rex.core.plan import Plan
from lightning_rex.core.window import Window
from lightning_rex.driver.exchange import ExchangeMessage
from lightning_rex.driver.observer import BackgroundObserver
from lightning_rex.driver.records import DecisionLog, build_record, decision_payload
from lightning_rex.driver.state import (
    device_rates,
    info_from_state,
    info_to_state,
    plan_from_device_rates,
)
from lightning_rex.lightning.collectives import (
    broadcast_row,
    device_key,
    gather_objects,
    gather_rows,
)
from lightning_rex.lightning.strategy import RexStrategy
from lightning_rex.measure.telemetry import GpuTelemetry, MemoryBound
from lightning_rex.measure.timing import ComputeTimer

__all__ = ["RexCallback"]

StepTimeFn = Callable[[int, int, int], float]


class RexCallback(Callback):
    """Adaptive per-rank micro-batch sizes for :class:`~lightning_rex.RexStrategy`.

    ``Trainer(strategy="rex")`` attaches one with the defaults; add it yourself to configure
    it. With ``strategy="ddp"`` it is monitor-only.

    Args:
        alpha: Family-wise significance level of the imbalance test, in (0, 1).
        window: Optimizer steps per observation window (>= 5).
        persistence: Consecutive imbalanced windows before a rescale (>= 1).
        min_effect: Practical effect threshold: a rank must be slower than the others by a
            median ratio above ``1 + min_effect`` (>= 0).
        max_micro_batch_size: The largest micro-batch any rank may get (None: bounded by
            free device memory on CUDA, by the global batch on CPU).
        max_growth: A rank's size may grow to at most this factor times the largest size it
            has already run, until that memory headroom is confirmed (CUDA; > 1).
        decision_lag: Steps between a window's end and the exchange of its decision (the
            controller computes in the background meanwhile), and between polls for a
            decision not ready yet; default ``window // 2``. Must be in [1, window).
        background: Run ``Controller.observe`` in a background thread on rank 0 (training
            never waits for it); False runs it inline at the window's end, so every
            decision lands on a step fixed in advance (deterministic, may stall).
        warmup: Optimizer steps at the start of a fit that are not measured (>= 0): the
            first steps time allocator warm-up, cuDNN autotuning or ``torch.compile``, not a
            rank's speed. Not applied again when resuming on the same world size.
        seed: The controller's seed.
        log_dir: Where to write ``rex_decisions.jsonl``; default the Trainer's ``log_dir``
            (or ``default_root_dir`` without a logger).
        step_time_fn: For tests and replays only: replaces measured compute times by
            ``step_time_fn(rank, step, micro_batch_size)`` seconds.

    Raises:
        ValueError: For arguments outside the ranges above, naming the argument.
    """

    def __init__(
        self,
        alpha: float = 0.01,
        window: int = 30,
        persistence: int = 2,
        min_effect: float = 0.05,
        max_micro_batch_size: int | None = None,
        max_growth: float = 2.0,
        decision_lag: int | None = None,
        background: bool = True,
        warmup: int = 10,
        seed: int = 0,
        log_dir: str | None = None,
        step_time_fn: StepTimeFn | None = None,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if int(window) != window or window < 5:
            raise ValueError(f"window must be an integer >= 5 steps, got {window}")
        if int(persistence) != persistence or persistence < 1:
            raise ValueError(f"persistence must be an integer >= 1 window, got {persistence}")
        if not min_effect >= 0.0:
            raise ValueError(f"min_effect must be >= 0, got {min_effect}")
        if max_micro_batch_size is not None and max_micro_batch_size < 1:
            raise ValueError(
                f"max_micro_batch_size must be >= 1 or None, got {max_micro_batch_size}"
            )
        if not max_growth > 1.0:
            raise ValueError(f"max_growth must be > 1, got {max_growth}")
        lag = window // 2 if decision_lag is None else decision_lag
        if int(warmup) != warmup or warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0 steps, got {warmup}")
        if not 1 <= lag < window:
            raise ValueError(f"decision_lag must be in [1, window={window}), got {decision_lag}")
        self.alpha, self.window, self.persistence = float(alpha), int(window), int(persistence)
        self.min_effect, self.max_micro_batch_size = float(min_effect), max_micro_batch_size
        self.max_growth, self.decision_lag, self.background = (
            float(max_growth),
            int(lag),
            background,
        )
        self.seed, self.log_dir, self.step_time_fn = int(seed), log_dir, step_time_fn
        self.warmup = int(warmup)
        self._reset_run_state()
        self._loaded: dict[str, Any] | None = None

    def _reset_run_state(self) -> None:
        self.adaptive = False
        self.controller: Controller | None = None
        self.plan_changes = 0
        self.plan_history: list[tuple[int, Plan]] = []
        self.records: list[dict[str, Any]] = []
        self._timer: ComputeTimer | None = None
        self._memory: MemoryBound | None = None
        self._telemetry: GpuTelemetry | None = None
        self._log: DecisionLog | None = None
        self._observer: BackgroundObserver | None = None  # rank 0 only
        self._exchange_at: int | None = None
        self._samples: list[Any] = []  # per step: timer handle or seconds
        self._steps: list[int] = []
        self._window_plan: Plan | None = None
        self._window_t0 = 0.0
        self._skip_until = 0
        self._last_global_step = 0
        self._step_ok = True
        self._step_t0 = 0.0
        self._micro_sizes: list[int] = []
        self._static_plan: Plan = ()
        self._device_keys: list[str] = []
        self._trainer_ref: pl.Trainer | None = None

    # ------------------------------------------------------------------ set-up
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Create the timer, memory bound and telemetry for this rank."""
        if stage != "fit":
            return
        self._trainer_ref = trainer
        device = trainer.strategy.root_device
        self._timer = ComputeTimer(device)
        self._memory = MemoryBound(device, self.max_micro_batch_size, self.max_growth)
        self._telemetry = GpuTelemetry(device)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Build the controller once the train loader (and so the plan) exists."""
        strategy = trainer.strategy
        n = trainer.world_size
        if isinstance(strategy, RexStrategy) and strategy.plan is not None:
            self.adaptive = strategy.adaptive
            plan: Plan = strategy.plan
            min_size = strategy.min_micro_batch_size
        else:
            bs = getattr(trainer.train_dataloader, "batch_size", None)
            if bs is None:
                rank_zero_warn("RexCallback: the train loader has no batch_size; monitoring is off")
                return
            plan, min_size = (int(bs),) * n, 1
        self._static_plan = plan
        assert self._timer is not None
        self._device_keys = [
            str(k)
            for k in gather_objects(
                trainer, device_key(trainer.strategy.root_device, self._telemetry)
            )
        ]
        loaded = self._loaded
        other_world = loaded is not None and int(loaded.get("world_size", n)) != n
        if other_world and isinstance(strategy, RexStrategy) and self.adaptive:
            # resumed on another world size: B is batch_size x the new N (the sampler did
            # that); the plan comes from the rates measured per device type, if all are known
            from_rates = plan_from_device_rates(
                (loaded or {}).get("device_rates", {}), self._device_keys, sum(plan), min_size
            )
            if from_rates is not None and from_rates != plan:
                self._skip_until = strategy.set_plan(from_rates)
                plan = from_rates
        self._timer.attach(pl_module.parameters())
        self._last_global_step = trainer.global_step
        # trainer.log_dir broadcasts from rank 0: every rank must ask for it
        directory = self.log_dir or trainer.log_dir or trainer.default_root_dir
        if trainer.global_rank == 0:
            caps = None if self.max_micro_batch_size is None else [self.max_micro_batch_size] * n
            self.controller = Controller(
                sum(plan),
                n,
                alpha=self.alpha,
                min_effect=self.min_effect,
                persistence=self.persistence,
                min_size=min_size,
                max_sizes=caps,
                seed=self.seed,
                initial_plan=plan,
            )
            self._log = DecisionLog(directory, trainer.loggers)
            self._observer = BackgroundObserver(self.controller, self.background)
        if loaded is not None:
            self._restore(trainer, loaded)
            self._loaded = None
        if loaded is None or other_world:  # a fresh start, not a same-size resume
            self._skip_until = max(self._skip_until, trainer.global_step + self.warmup)
        if not self.plan_history:
            self.plan_history.append((trainer.global_step, plan))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Release hooks and the background thread."""
        if self._timer is not None:
            self._timer.detach()
        if self._observer is not None:
            self._observer.shutdown()

    # ------------------------------------------------------------------ per step
    def _current_sizes(self, trainer: pl.Trainer) -> Plan | None:
        strategy = trainer.strategy
        if isinstance(strategy, RexStrategy):
            return strategy.current_batch_sizes()
        return None

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Start timing this rank's compute."""
        if self._timer is None or not self._timer._handles:
            return
        if trainer.global_step == self._last_global_step and not self._micro_sizes:
            self._step_ok = True
            self._step_t0 = time.perf_counter()
            assert self._memory is not None
            self._memory.step_start()
        sizes = self._current_sizes(trainer)
        plan = self._plan_at(trainer, trainer.global_step)
        if sizes is not None and sizes != plan:
            self._step_ok = False  # the epoch's final partial batch: not comparable
        self._micro_sizes.append(
            plan[trainer.global_rank] if sizes is None else sizes[trainer.global_rank]
        )
        self._timer.start()

    def _plan_at(self, trainer: pl.Trainer, step: int) -> Plan:
        strategy = trainer.strategy
        if isinstance(strategy, RexStrategy) and strategy.train_loader is not None:
            return strategy.train_loader.batch_sampler.plan_at(step)
        return self._static_plan

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """Close the micro-batch; on an optimizer step, record it and run the schedule."""
        if self._timer is None or not self._timer._handles:
            return
        self._timer.stop()
        if trainer.global_step == self._last_global_step:
            return  # accumulating: the optimizer step is not done yet
        step = self._last_global_step
        self._last_global_step = trainer.global_step
        handle = self._timer.take_step()
        micro = self._micro_sizes
        self._micro_sizes = []
        assert self._memory is not None
        self._memory.step_end(max(micro))
        plan = self._plan_at(trainer, step)
        if self.step_time_fn is not None:
            handle = sum(self.step_time_fn(trainer.global_rank, step, b) for b in micro)
        if self._step_ok and step >= self._skip_until:
            if not self._samples:
                self._window_plan, self._window_t0 = plan, self._step_t0
            if plan == self._window_plan:
                self._samples.append(handle)
                self._steps.append(step)
        if self._exchange_at is not None and step >= self._exchange_at:
            self._exchange(trainer, step)
        if len(self._samples) >= self.window:
            self._close_window(trainer, step)

    # ------------------------------------------------------------------ window boundary
    def _close_window(self, trainer: pl.Trainer, last_step: int) -> None:
        assert (
            self._timer is not None and self._memory is not None and self._window_plan is not None
        )
        times = self._timer.resolve(self._samples)
        rank = trainer.global_rank
        cap = self._memory.cap(self._window_plan[rank])
        local = torch.tensor([*times, -1.0 if cap is None else float(cap)], dtype=torch.float64)
        gathered = gather_rows(trainer, local)
        # decided by the device type, the same on every rank, so all ranks call it or none
        telemetry = (
            gather_objects(trainer, self._telemetry.sample() if self._telemetry else None)
            if trainer.strategy.root_device.type == "cuda"
            else None
        )
        wall = time.perf_counter() - self._window_t0
        k = len(times)
        if rank == 0 and self.controller is not None:
            caps_arr = gathered[:, k]
            caps = (
                None
                if bool((caps_arr < 0).all())
                else [None if c < 0 else int(c) for c in caps_arr]
            )
            window = Window(
                np.asarray(gathered[:, :k], dtype=np.float64),
                self._window_plan,
                self._steps[0],
                self._steps[-1] + 1,
            )
            samples = k * sum(self._window_plan)  # the true global count, not N x rank 0's
            info = {
                "window": window,
                "telemetry": telemetry,
                "window_samples": samples,
                "window_wall_s": wall,
                "global_samples_per_s": samples / wall if wall > 0 else None,
            }
            assert self._observer is not None
            self._observer.submit(window, info, caps)
        self._samples, self._steps = [], []
        self._schedule_exchange(last_step + self.decision_lag)

    def _schedule_exchange(self, step: int) -> None:
        self._exchange_at = step if self._exchange_at is None else min(self._exchange_at, step)

    def _exchange(self, trainer: pl.Trainer, step: int) -> None:
        self._exchange_at = None
        # rank 0 sends the decisions that are ready (never waiting for one still computing)
        # and keeps them for its records
        ready: list[tuple[dict[str, Any], dict[str, Any]]] = []
        mine = ExchangeMessage()
        if self._observer is not None:
            ready = [self._payload(d, info) for d, info in self._observer.take_ready()]
            mine = ExchangeMessage.from_ready(
                [p["imbalance"] for p, _ in ready],
                [p["plan"] for p, _ in ready],
                self._observer.pending,
            )
        n = trainer.world_size
        message = ExchangeMessage.from_tensor(broadcast_row(trainer, mine.to_tensor(n)))
        if message.more_pending:
            self._schedule_exchange(step + self.decision_lag)  # poll again
        if not message.decided:
            return
        imbalance = message.imbalance
        effective = None
        if message.plan is not None and self.adaptive:
            strategy = trainer.strategy
            assert isinstance(strategy, RexStrategy)
            effective = strategy.set_plan(message.plan)
            self._skip_until = effective
            self._samples, self._steps = [], []
            self.plan_changes += 1
            self.plan_history.append((effective, message.plan))
        changes = self.plan_changes - (effective is not None)  # before this exchange's plan
        for payload, info in ready:
            applied = effective if payload["plan"] is not None else None
            changes += applied is not None
            self._record(trainer, payload, info, applied, changes)
        if trainer.progress_bar_callback is not None:
            # the progress bar keeps the last value, so once a window is enough
            trainer.lightning_module.log_dict(
                {"rex_imb%": 100.0 * imbalance, "rex_changes": float(self.plan_changes)},
                prog_bar=True,
                logger=False,
            )

    def _payload(
        self, decision: dict[str, Any], info: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        payload = decision_payload(decision, info["window"], self.adaptive)
        if payload["kind"] == "recommend":  # monitor-only: tell the core it was not applied
            assert self._observer is not None
            self._observer.decline()
        return payload, info

    def _record(
        self,
        trainer: pl.Trainer,
        payload: dict[str, Any],
        info: dict[str, Any],
        effective: int | None,
        plan_changes: int,
    ) -> None:
        info = dict(info)
        record = build_record(info.pop("window"), payload, info, effective)
        record.update(plan_changes=plan_changes, adaptive=self.adaptive)
        self.records.append(record)
        assert self._log is not None
        self._log.write(record, step=trainer.global_step)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Controller state, the partial window of every rank, the schedule of the exchange.

        Called on every rank when Lightning dumps a checkpoint; it gathers the partial
        window (one collective), so every rank must save checkpoints together, as Lightning
        does. On rank 0 it first waits for the controller's background work (at most a
        hyperparameter fit or two), and saves the decisions not yet exchanged.

        Returns:
            A dictionary of plain Python values.
        """
        trainer = self._trainer_ref
        if trainer is None or self._timer is None:
            return {}
        times = self._timer.resolve(self._samples)
        gathered = gather_rows(trainer, torch.tensor(times, dtype=torch.float64))
        pending = [
            {"decision": d, "info": info_to_state(info)}
            for d, info in (self._observer.drain() if self._observer is not None else [])
        ]
        return {
            "world_size": trainer.world_size,
            "device_rates": (
                device_rates(self._device_keys, self.controller.rank_model_summary())
                if self.controller is not None
                else {}
            ),
            "controller": None if self.controller is None else self.controller.state_dict(),
            "partial": gathered.tolist(),
            "steps": list(self._steps),
            "window_plan": None if self._window_plan is None else list(self._window_plan),
            "exchange_at": self._exchange_at,
            "pending": pending,
            "skip_until": self._skip_until,
            "plan_changes": self.plan_changes,
            "plan_history": [[s, list(p)] for s, p in self.plan_history],
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the state until the controller exists (``on_train_start``).

        Args:
            state_dict: A dictionary from :meth:`state_dict`.
        """
        self._loaded = dict(state_dict) if state_dict else None

    def _restore(self, trainer: pl.Trainer, s: dict[str, Any]) -> None:
        if int(s["world_size"]) != trainer.world_size:
            rank_zero_warn(
                f"RexCallback: the checkpoint was made with {s['world_size']} ranks, this run has "
                f"{trainer.world_size}; the controller starts afresh from the plan "
                f"{self._plan_at(trainer, trainer.global_step)} (rates known per device: "
                f"{sorted(s.get('device_rates', {}))})"
            )
            self.plan_history = [(trainer.global_step, self._plan_at(trainer, trainer.global_step))]
            return
        if self.controller is not None and s["controller"] is not None:
            self.controller.load_state_dict(s["controller"])
        self._samples = [float(t) for t in s["partial"][trainer.global_rank]]
        self._steps = [int(x) for x in s["steps"]]
        self._window_plan = None if s["window_plan"] is None else tuple(s["window_plan"])
        self._window_t0 = time.perf_counter()
        self._exchange_at = s["exchange_at"]
        self._skip_until = int(s["skip_until"])
        self.plan_changes = int(s["plan_changes"])
        self.plan_history = [(int(a), tuple(int(b) for b in p)) for a, p in s["plan_history"]]
        if self._observer is not None and s["pending"]:
            self._observer.restore(
                [(p["decision"], info_from_state(p["info"])) for p in s["pending"]]
            )
