"""The window loop: step times in, windows to the decider, decisions exchanged, plans applied.

:class:`WindowDriver` is what training and the simulator share (docs/driver.md has the full
account). Each process runs one, and every call is made by every process at the same step,
so the collectives it issues line up: :meth:`~WindowDriver.start` agrees on the run and
restores a checkpoint; :meth:`~WindowDriver.record` takes each step's own compute times,
gathers them every segment (one collective) and hands rank 0's decider the
:class:`~lightning_rex.core.window.Window`; ``decision_lag`` steps later an **exchange**
broadcasts the decisions that are ready (never waiting for one still computing) and a plan
is scheduled on every rank from the first step nobody has fetched
(:mod:`~lightning_rex.driver.scheduling`); :meth:`~WindowDriver.state_dict` gathers the
partial window for a checkpoint, and :meth:`~WindowDriver.finish` agrees that nothing
failed. Local work runs under :meth:`~WindowDriver.guard`, so that a failure on one rank is
raised on every rank at the next collective (:class:`~lightning_rex.driver.errors.Failures`),
never left to a socket closing.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from lightning_rex.core.decision import Decision
from lightning_rex.core.plans.plan import Plan
from lightning_rex.core.plans.schedule import SizeBounds
from lightning_rex.driver.checkpoint import check_state, decider_state, loop_state
from lightning_rex.driver.config import LoopConfig
from lightning_rex.driver.errors import Failures
from lightning_rex.driver.exchange import ExchangeMessage
from lightning_rex.driver.gathering import Gathering, as_seconds
from lightning_rex.driver.joining import fitted_first_plan, join
from lightning_rex.driver.observer import BackgroundObserver, Pending
from lightning_rex.driver.prior import warn_uncovered
from lightning_rex.driver.protocols import Collectives, Decider, PlanTarget
from lightning_rex.driver.records import pending_record
from lightning_rex.driver.scheduling import agreed_step
from lightning_rex.driver.stopping import StopRequests
from lightning_rex.driver.windows import usable_steps, window_info, window_of

__all__ = ["WindowDriver"]

DeciderFactory = Callable[[Plan, SizeBounds], Decider]

_PREFETCH_HORIZON = 1024
"""Steps past a resumed fit's first step that a saved future step may lie (a plan's first
step waits for every batch already fetched, DataLoader workers' prefetch included)."""


class WindowDriver:
    """One process's part of the window loop (see the module docstring).

    Args:
        config: The loop's settings.
        collectives: The collectives (:class:`~lightning_rex.driver.protocols.Collectives`).
        target: Where plans take effect (:class:`~lightning_rex.driver.protocols.PlanTarget`).
        make_decider: Builds the decider on rank 0 from the plan in force and the bounds.
        check_decider_state: Checks a saved decider state on every rank before a resume
            (``Controller.check_state``), or None.
        resolve: Turns the samples passed to :meth:`record` into seconds, shape
            ``(hosted, K)`` (CUDA events are read here, once per window); default: they are
            seconds already.
        clock: Wall-clock seconds, for the window's throughput (the simulator passes its
            simulated clock).
        caps: Each hosted rank's pass cap (the largest micro-batch it runs in one pass: its
            memory, None for none), read at every window's close; the decider takes it as
            soft (``set_pass_caps``): a larger size runs as ``ceil(b / cap)`` accumulation
            passes (:func:`~lightning_rex.core.passes.passes`), priced, never forbidden. It
            must be the cap the rank split the window's steps by. None: no caps.
        telemetry: Each hosted rank's telemetry sample, gathered with every window, or None
            (the same choice on every rank).
        on_record: Receives each window's record on rank 0.
        on_exchange: Receives every exchange's message, on every rank.
    """

    def __init__(
        self,
        config: LoopConfig,
        collectives: Collectives,
        target: PlanTarget,
        make_decider: DeciderFactory,
        *,
        check_decider_state: Callable[[Any, int, int], Any] | None = None,
        resolve: Callable[[list[Any]], np.ndarray] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        caps: Callable[[], list[int | None]] | None = None,
        telemetry: Callable[[], list[Any]] | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        on_exchange: Callable[[ExchangeMessage], None] | None = None,
    ) -> None:
        self.config, self.collectives, self.target = config, collectives, target
        self._make_decider, self._check_decider = make_decider, check_decider_state
        self._resolve, self._clock = resolve or as_seconds, clock
        self._caps, self._telemetry = caps, telemetry
        self._on_record, self._on_exchange = on_record, on_exchange
        self.decider: Decider | None = None
        self.observer: BackgroundObserver | None = None
        self.records: list[dict[str, Any]] = []
        self.run_id = ""
        #: The run id of the checkpoint this fit resumed (None for a fresh start).
        self.resumed_from: str | None = None
        #: Whether a resumed fit continued the checkpoint's window loop exactly (True), or
        #: started afresh from it (False: another world size or global batch); None fresh.
        self.continued: bool | None = None
        self.dropped = 0
        self.device_keys: list[str] = []
        self.failed = False
        self.stops = StopRequests()  #: a preemption signal's, carried by the next exchange
        self._failures = Failures()
        self._exchange_at: int | None = None
        self.gathering = Gathering()  # the window in progress
        self._last_clock = 0.0

    # ------------------------------------------------------------------ properties
    @property
    def is_rank_zero(self) -> bool:
        """Whether this process hosts rank 0 (and so the decider)."""
        return self.collectives.rank == 0

    @property
    def exchange_at(self) -> int | None:
        """The step of the next exchange, agreed by every rank, or None."""
        return self._exchange_at

    @property
    def measuring_from(self) -> int:
        """The first step that may be measured (warm-up, or a new plan's first step)."""
        return self.gathering.skip_until

    # ------------------------------------------------------------------ failures
    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run local work; an exception is kept and raised on every rank at the next collective.

        Only for work that issues no collective (:class:`~lightning_rex.driver.errors.Failures`).

        Args:
            what: What the work is, for the error message ("reading the timer").

        Yields:
            Nothing.
        """
        with self._failures.guard(what):
            yield

    def _flags(self) -> np.ndarray:
        return self._failures.flags(self.collectives.hosted)

    def _check(self, flags: np.ndarray, where: str) -> None:
        """Every rank: raise the first failing rank's error if any rank's flag is set."""
        self._failures.raise_if_any(flags, where, self.collectives, self._end_on_failure)

    def _end_on_failure(self) -> None:
        self.failed = True  # on every rank alike: nothing more to save or exchange
        self.close()

    # ------------------------------------------------------------------ start
    def start(
        self,
        step: int,
        device_keys: Sequence[str],
        state: dict[str, Any] | None = None,
        prior: dict[str, list[float]] | None = None,
    ) -> None:
        """Begin a fit at ``step`` (every rank).

        Args:
            step: The first step of this fit.
            device_keys: Each hosted rank's device identity (a GPU's name, or ``"cpu"``).
            state: A :meth:`state_dict` from a checkpoint, or None for a fresh start.
            prior: Rates per device identity for a fresh start's first plan (rank 0's is used;
                it warns when a rank's device is missing:
                :func:`~lightning_rex.driver.prior.warn_uncovered`).

        Raises:
            StateError: On every rank alike, when the checkpoint state breaks an invariant.
            RexRankError: On every rank, when a rank failed to start.
        """
        sched = self.target.plan_schedule
        world_size, global_batch, bounds = sched.world_size, sched.global_batch, sched.bounds
        saved = None
        if state is not None:
            saved = check_state(
                state,
                world_size,
                global_batch,
                bounds,
                self._check_decider,
                sched.batch_range,
                resumed=self.target.resumed,
                step=step,
                horizon=self.config.window.warmup + self.config.window.steps + _PREFETCH_HORIZON,
            )
        # every fit is a run of its own; a resumed one names the run it continues
        failure = self._failures.failure
        mine = None if failure is None else failure[1]
        free, run_id = self.target.first_free_step(), uuid.uuid4().hex[:12]
        joined = join(self.collectives, device_keys, free, run_id, mine, prior, self.is_rank_zero)
        self._check(np.array(joined.failed, dtype=float), "the start of the fit")
        self.device_keys = joined.device_keys
        self.run_id = joined.run_id
        self.resumed_from = None if saved is None else saved["run_id"]
        plan = sched.plan_at(step)
        gathering = self.gathering
        gathering.fit_start, gathering.warm_until = None, None
        same = saved is not None and saved["continues"]
        self.continued = None if saved is None else same
        # rates measured before (a resume on another world size) or given (a fresh start's
        # prior): the fitted plan instead of the one the schedule holds
        rates = saved["device_rates"] if saved is not None else joined.prior
        if saved is None and joined.prior is not None and self.is_rank_zero:
            warn_uncovered(joined.prior, joined.device_keys)
        first = fitted_first_plan(rates, joined, sched, step)
        if first is not None and not same and self.config.apply_plans:
            plan = self.target.schedule_plan(*first)
            gathering.skip_until = first[1]
        if same:
            assert saved is not None
            gathering.restore(saved, self.collectives.rank, self.collectives.hosted, world_size)
            self._exchange_at = saved["exchange_at"]
            self.dropped = saved["dropped"]
        else:
            gathering.begin(step, self.config.window, self.device_keys)
        if self.is_rank_zero:
            with self.guard("building the decider"):
                self.decider = self._make_decider(plan, bounds)
                if same and saved is not None and saved["controller"] is not None:
                    self.decider.load_state_dict(saved["controller"])
                    # this run's bounds, not the checkpoint's (a new minimum, say)
                    self.decider.set_bounds(bounds.min_size, bounds.caps(world_size))
                self.observer = BackgroundObserver(
                    self.decider, bounds.min_size, self.config.background, self.config.estimate
                )
                if same and saved is not None:
                    self.observer.restore(saved["pending"])
        flag = self.collectives.broadcast_row(np.array([float(self._failures.failure is not None)]))
        self._check(np.r_[flag[:1], np.zeros(world_size - 1)], "the start of the fit")
        self._last_clock = gathering.t0 = self._clock()

    # ------------------------------------------------------------------ per step
    def record(self, step: int, sample: Any, comparable: bool = True) -> None:
        """Take one step's own compute time of every hosted rank, then run the schedule.

        Args:
            step: The step just trained.
            sample: One sample per hosted rank (seconds, or what ``resolve`` reads).
            comparable: False when the step's sizes are not the plan's (the epoch's final
                partial batch), so it is left out of windows; the same on every rank.
        """
        now, gathering = self._clock(), self.gathering
        if step >= gathering.skip_until and comparable:
            gathering.add(step, sample, self.target.plan_schedule.plan_at(step), self._last_clock)
        self._last_clock = now
        if self._exchange_at is not None and step >= self._exchange_at:
            self._exchange(step)
        steps, lag = self.config.look(gathering.first_look)
        if len(gathering.steps) >= steps:
            gathering.first_look = False
            self._close(step, lag)

    def _read(self, what: str) -> np.ndarray:
        """The window's samples as seconds, ``(hosted, num_steps)``; NaN where reading failed."""
        num_steps, hosted = len(self.gathering.steps), self.collectives.hosted
        out = np.full((hosted, num_steps), np.nan)
        with self.guard(what):
            if num_steps:
                rows = self._resolve(self.gathering.samples)
                out[:] = np.asarray(rows, dtype=np.float64).reshape(hosted, num_steps)
        return out

    def _close(self, step: int, lag: int) -> None:
        num_steps, hosted = len(self.gathering.steps), self.collectives.hosted
        rows = np.full((hosted, num_steps + 2), np.nan)
        rows[:, :num_steps] = self._read("reading the window's step times")
        rows[:, num_steps] = -1.0
        if self._caps is not None:
            with self.guard("reading the memory bound"):
                rows[:, num_steps] = [-1.0 if c is None else float(c) for c in self._caps()]
        rows[:, num_steps + 1] = self._flags()
        gathered = self.collectives.gather_rows(rows)
        self._check(gathered[:, num_steps + 1], f"the gather of the window ending at step {step}")
        telemetry = None
        if self._telemetry is not None:
            local: list[Any] = [None] * hosted
            with self.guard("reading telemetry"):
                local = list(self._telemetry())
            telemetry = self.collectives.gather_objects(local)
        if self.is_rank_zero:
            with self.guard("building the window"):
                self._submit(gathered[:, :num_steps], gathered[:, num_steps], telemetry, step + lag)
        self.gathering.clear()
        self._schedule_exchange(step + lag)

    def _submit(self, times: np.ndarray, caps_col: np.ndarray, telemetry: Any, due: int) -> None:
        gathering = self.gathering
        assert self.observer is not None and gathering.plan is not None
        num_steps = times.shape[1]
        good, bad = usable_steps(times, gathering.steps, self.dropped)
        self.dropped += bad
        if int(good.sum()) < self.config.min_steps:
            return
        if gathering.still_warming(times[:, good]):
            return  # still warming up: the next block is judged
        warmup = gathering.take_warmup()
        wall = math.nan if gathering.resumed else self._clock() - gathering.t0
        window = window_of(times, gathering.plan, gathering.steps, good, wall)
        gathering.resumed = False
        samples = num_steps * sum(gathering.plan)  # the true global count, not N x rank 0's
        info = window_info(telemetry, samples, wall, bad, warmup)
        caps = None if bool((caps_col < 0).all()) else [None if c < 0 else int(c) for c in caps_col]
        self.observer.submit(window, info, caps, due)

    def _schedule_exchange(self, step: int) -> None:
        self._exchange_at = step if self._exchange_at is None else min(self._exchange_at, step)

    # ------------------------------------------------------------------ exchange
    def _exchange(self, step: int) -> None:
        """Every rank: flags and free steps gathered, rank 0's decisions broadcast, plan set."""
        self._exchange_at = None
        ready: list[Pending] = []
        world_size = self.target.plan_schedule.world_size
        row = ExchangeMessage().to_row(world_size)
        if self.is_rank_zero and self.observer is not None:
            with self.guard("deciding on a window"):
                # the decisions ready now, and those whose own exchange is past (waited for:
                # at most one poll late); a decider's error is raised into the guard
                ready = self.observer.take_decisions(self.config.apply_plans, step)
                apply = self.config.apply_plans
                row = ExchangeMessage.from_ready(
                    [float(e.window.medians.max() / e.window.medians.min() - 1) for e in ready],
                    [
                        e.outcome.plan if apply and isinstance(e.outcome, Decision) else None
                        for e in ready
                    ],
                    self.observer.pending,
                ).to_row(world_size)
        if self._failures.failure is not None and self.is_rank_zero:
            ready, row = [], ExchangeMessage(failed=True).to_row(world_size)
        # every rank's failure flag, first unfetched step and stop request; rank 0's decisions
        local = np.zeros((self.collectives.hosted, 3))
        local[:, 0], local[:, 1] = self._flags(), self.target.first_free_step()
        local[:, 2] = self.stops.column(self.collectives.hosted)
        gathered = self.collectives.gather_rows(local)
        self._check(gathered[:, 0], f"the exchange at step {step}")
        self.stops.agree(gathered[:, 2], step)
        msg = ExchangeMessage.from_row(self.collectives.broadcast_row(row))
        if msg.failed:
            self._check(np.r_[1.0, np.zeros(world_size - 1)], f"the exchange at step {step}")
        if msg.more_pending:
            self._schedule_exchange(step + self.config.lag)
        before = self.target.plan_schedule.changes
        effective = None
        if msg.plan is not None:
            effective = agreed_step(gathered[:, 1], step + 1)
            self.target.schedule_plan(msg.plan, effective)
            self.gathering.skip_until = effective
            self.gathering.clear()
        if ready:
            with self.guard("writing the decision records"):
                for pending in ready:
                    self._record(pending, msg.plan, effective, before)
        if self._on_exchange is not None:
            self._on_exchange(msg)

    def _record(
        self, e: Pending, applied: Plan | None, effective: int | None, before: int, note: str = ""
    ) -> None:
        apply, run, resumed = self.config.apply_plans, self.run_id, self.resumed_from
        record = pending_record(
            e, applied, effective, before, apply, run, resumed, self.device_keys, note
        )
        self.records.append(record)
        if self._on_record is not None:
            self._on_record(record)

    # ------------------------------------------------------------------ checkpoints and end
    def state_dict(self) -> dict[str, Any]:
        """The loop's state for a checkpoint (every rank: it gathers the partial window).

        On rank 0 it first waits for the decider's background work (at most a refit or two)
        and saves the decisions not yet exchanged.

        Returns:
            JSON-able data (see :mod:`lightning_rex.driver.checkpoint`); empty after a
            :class:`RexRankError` (raised on every rank: a save while handling it, such as
            Lightning's ``OnExceptionCheckpoint``, must not start another collective).

        Raises:
            RexRankError: On every rank, when a rank's work had failed.
        """
        if self.failed:
            return {}
        pending: list[dict[str, Any]] = []
        controller = None
        rates: dict[str, list[float]] = {}
        if self.is_rank_zero and self.observer is not None and self.decider is not None:
            with self.guard("saving the decider's state"):
                pending, controller, rates = decider_state(self.observer, self.device_keys)
        gathering = self.gathering
        num_steps = len(gathering.steps)
        rows = np.full((self.collectives.hosted, num_steps + 1), np.nan)
        rows[:, :num_steps] = self._read("reading the window's step times for a checkpoint")
        rows[:, num_steps] = self._flags()
        gathered = self.collectives.gather_rows(rows)
        self._check(gathered[:, num_steps], "saving a checkpoint")
        return loop_state(
            run_id=self.run_id,
            schedule=self.target.plan_schedule,
            gathering=gathering,
            exchange_at=self._exchange_at,
            partial=gathered[:, :num_steps],
            pending=pending,
            dropped=self.dropped,
            controller=controller,
            rates=rates,
        )

    def finish(self) -> None:
        """End of training (every rank): record what is left, agree that no rank failed.

        Decisions still waiting for an exchange are recorded on rank 0 (a plan among them
        was never applied: the decider is told, as in monitor-only use), then every rank
        gathers the failure flags once more, and the decider's thread stops.

        Raises:
            RexRankError: On every rank, when a rank's work had failed.
        """
        if self.is_rank_zero and self.observer is not None:
            with self.guard("finishing the decider's work"):
                self.observer.drain()
                before = self.target.plan_schedule.changes
                for entry in self.observer.take_decisions(self.config.apply_plans):
                    planned = isinstance(entry.outcome, Decision) and entry.outcome.plan is not None
                    if self.config.apply_plans and planned:
                        self.observer.decline()
                    self._record(entry, None, None, before, "training ended before its exchange")
                self.observer.drain()
        gathered = self.collectives.gather_rows(self._flags()[:, None])
        self._check(gathered[:, 0], "the end of training")
        self.close()

    def close(self) -> None:
        """Stop the decider's thread (no collective; safe after an error)."""
        if self.observer is not None:
            self.observer.shutdown()
