"""The benchmark's runs: a compute-bound model and real 2-process fits (``bench`` command).

:mod:`lightning_rex.tools.bench_cli` holds the command line (it imports this module only to
run, so that ``python -m lightning_rex --help`` does not load torch or Lightning); see it for
what the benchmark measures and how.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning_rex.core.plans.plan import round_fractions
from lightning_rex.lightning.callback import RexCallback
from lightning_rex.lightning.strategy import RexStrategy
from lightning_rex.tools.bench_cases import case_model, needs_unused_parameters
from lightning_rex.tools.bench_model import BenchModel
from lightning_rex.tools.emulator import HeterogeneityEmulator
from lightning_rex.tools.headline import even_split_headline

__all__ = [
    "MODEL_SIZES",
    "PER_RANK_BATCH",
    "BenchModel",
    "default_plan",
    "pin_rank",
    "run_benchmark",
    "run_emulation_check",
]

PER_RANK_BATCH = 32
"""Samples per rank and step: the DataLoader's ``batch_size``."""
TOKENS = 16
MODEL_SIZES = {"small": (64, 2), "medium": (256, 6), "large": (512, 6)}
"""The emulation check's models, ``name: (width, depth)``: about 0.4, 38 and 150 MFLOP a
sample forward and backward (1, 10 and 33 ms a step of 32 samples on one core here)."""


class _StepTimer(L.Callback):
    """Times synchronous steps on rank 0 and writes the measurements to a JSON file.

    ``on_step`` is called on rank 0 after every step with the steps done: the ranks are
    forked processes, so it runs in rank 0's process (writing to the inherited stderr works;
    state set in it does not reach the parent).
    """

    def __init__(
        self,
        out: str,
        warmup: int,
        threads: int,
        pin: bool = False,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        self.out, self.warmup, self.threads, self.pin = out, warmup, threads, pin
        self.on_step = on_step
        self.steps: list[tuple[int, float, float, int]] = []  # (step, start, end, samples)
        self._t = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.threads > 0:  # 0: torch's default
            torch.set_num_threads(self.threads)
        if self.pin:
            pin_rank(trainer.global_rank, trainer.world_size)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step - 1  # the optimizer step just taken
        strategy = trainer.strategy
        sizes = strategy.current_batch_sizes() if isinstance(strategy, RexStrategy) else None
        samples = sum(sizes) if sizes else PER_RANK_BATCH * trainer.world_size
        self.steps.append((step, self._t, time.perf_counter(), samples))
        if self.on_step is not None and trainer.global_rank == 0:
            self.on_step(step + 1)

    def _rate(self, first_step: int) -> float:
        kept = [s for s in self.steps if s[0] >= first_step]
        if len(kept) < 2:
            return float("nan")
        # from the start of the first kept step to the end of the last: inter-step time counts
        return sum(s[3] for s in kept) / (kept[-1][2] - kept[0][1])

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank != 0:
            return
        strategy = trainer.strategy
        plan = getattr(strategy, "plan", None)
        timed = [s for s in self.steps if s[0] >= self.warmup]
        result: dict[str, Any] = {
            "samples_per_s": self._rate(self.warmup),
            "step_ms_median": 1000 * statistics.median(s[2] - s[1] for s in timed),
            "plan": list(plan) if plan else [PER_RANK_BATCH] * trainer.world_size,
        }
        callbacks = trainer.callbacks  # type: ignore[attr-defined]
        rex = next((c for c in callbacks if isinstance(c, RexCallback)), None)
        if isinstance(strategy, RexStrategy) and strategy.adaptive and rex is not None:
            result["adaptive"] = True
            result["plan_history"] = [[s, list(p)] for s, p in rex.plan_history]
            # an accept, or a propose that refines the plan it has just validated
            accepted = [r for r in rex.records if r["validated"]]
            first = accepted[0]["window"][0] if accepted else None
            result["first_accept_step"] = first
            result["samples_per_s_after_first_accept"] = (
                None if first is None else self._rate(first)
            )
            result["decisions"] = [
                [r["step"], r["decision"], r["new_plan"]]
                for r in rex.records
                if r["decision"] != "hold"
            ]
            headline = even_split_headline(rex.records)
            if headline is not None:  # the report's estimate of the even split, to check
                result["headline_even_samples_per_s"] = list(headline.even)
                result["headline_speedup"] = list(headline.speedup)
        Path(self.out).write_text(json.dumps(result))


def pin_rank(rank: int, world_size: int) -> bool:
    """Pin every thread of this process to one core, ``rank``'s own, where there are enough.

    Threads started later (the RexCallback's controller thread) inherit the core.

    Args:
        rank: The rank.
        world_size: How many ranks share this machine.

    Returns:
        Whether the process was pinned (False without ``sched_setaffinity`` or with fewer
        cores than ranks).
    """
    if not hasattr(os, "sched_setaffinity"):
        return False
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < world_size:
        return False
    core = {cpus[rank % len(cpus)]}
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread only
        tids = [0]
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, core)
    return True


def _run_once(
    strategy_name: str,
    args: argparse.Namespace,
    plan: list[int] | None,
    on_step: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    devices = args.devices
    steps = args.steps
    global_batch = PER_RANK_BATCH * devices
    generator = torch.Generator().manual_seed(0)
    num_samples = global_batch * steps
    dataset = TensorDataset(
        torch.randn(num_samples, TOKENS, 32, generator=generator),
        torch.randint(0, 10, (num_samples,), generator=generator),
    )
    case = getattr(args, "case", "plain")
    slow_forward = getattr(args, "slow_forward", None)
    unused = needs_unused_parameters(case)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        strategy: Any
        callbacks: list[L.Callback] = [
            _StepTimer(out, args.warmup, args.threads, pin=args.pin, on_step=on_step),
        ]
        if slow_forward is None:  # else the model's own forward is slow on the slow ranks
            callbacks.insert(
                0, HeterogeneityEmulator(args.slowdowns, args.events, headroom=args.headroom)
            )
        if strategy_name == "ddp":
            strategy = DDPStrategy(start_method="fork", find_unused_parameters=unused)
        elif strategy_name == "emulation":
            # the even plan, monitored: the decision records give each rank's compute time
            strategy = RexStrategy(
                start_method="fork", adaptive=False, find_unused_parameters=unused
            )
            callbacks.append(RexCallback(window=args.window, log_dir=tmp))
        elif strategy_name == "rex" and args.adaptive:
            # adaptive rex starts where a user starts: the even plan
            strategy = RexStrategy(
                start_method="fork", adaptive=True, find_unused_parameters=unused
            )
            callbacks.append(RexCallback(window=args.window, log_dir=tmp))
        else:
            strategy = RexStrategy(
                micro_batch_sizes=plan,
                start_method="fork",
                adaptive=False,
                find_unused_parameters=unused,
            )
        trainer = L.Trainer(
            accelerator="cpu",
            devices=devices,
            strategy=strategy,
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=callbacks,
            default_root_dir=tmp,
        )
        torch.manual_seed(0)
        loader = DataLoader(dataset, batch_size=PER_RANK_BATCH, shuffle=True)
        trainer.fit(case_model(args, case), loader)
        result = dict(json.loads(Path(out).read_text()))
        if strategy_name == "emulation":
            log = Path(tmp) / "rex_decisions.jsonl"
            result["window_medians_ms"] = [
                json.loads(line)["median_ms"] for line in log.read_text().splitlines()
            ]
        return result


def default_plan(slowdowns: Sequence[float], devices: int) -> list[int]:
    """The static plan for known slowdowns: sizes proportional to each rank's speed.

    Args:
        slowdowns: Per-rank slowdown factors.
        devices: The number of ranks.

    Returns:
        Sizes summing to ``32 x devices``.
    """
    speeds = [1.0 / s for s in slowdowns]
    total = sum(speeds)
    return list(round_fractions([s / total for s in speeds], PER_RANK_BATCH * devices))


def run_benchmark(
    args: argparse.Namespace,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run every strategy of ``args.compare`` ``args.repeat`` times, interleaved.

    Args:
        args: The parsed command line (see :func:`~lightning_rex.tools.bench_cli.add_parser`).
        progress: Called after every run with ``(runs done, runs in all, the run)``; by
            default a line per run goes to stderr.
        on_step: Called in rank 0's (forked) process after every step with ``(runs done
            before this one, steps done in this run)``, for progress within a run.

    Returns:
        ``{"runs": [...], "ratio_rex_over_ddp": float}`` (the ratio only when both ran), plus
        ``ratios`` (per repeat), and with ``rex-static`` or ``--adaptive`` the matching
        ``ratio_rex_static_over_ddp`` and ``ratio_rex_after_first_accept_over_ddp``; with
        ``--adaptive``, ``headline_even_over_ddp`` per repeat: the report's estimate of the
        even split's throughput (from rex's records) over the paired ddp run's measured one.
    """
    plan = args.micro_batch_sizes or default_plan(args.slowdowns, args.devices)
    runs: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        # ABBA order: odd repeats run the strategies in reverse, so that a drift of the
        # machine's speed does not favour whichever strategy runs first
        order = args.compare if rep % 2 == 0 else list(reversed(args.compare))
        for name in order:
            step_cb = None if on_step is None else functools.partial(on_step, len(runs))
            res = _run_once(name, args, plan, step_cb)
            runs.append({"strategy": name, "repeat": rep, **res})
            if progress is not None:
                progress(len(runs), args.repeat * len(args.compare), runs[-1])
                continue
            _log(
                f"{name:10s} repeat {rep}: {res['samples_per_s']:.1f} samples/s, "
                f"median step {res['step_ms_median']:.1f} ms, plan {res['plan']}"
            )
    result: dict[str, Any] = {"runs": runs}
    if "ddp" not in args.compare:
        return result

    def ratio(name: str, key: str = "samples_per_s") -> list[float]:
        out = []
        for rep in range(args.repeat):
            by_strategy = {r["strategy"]: r for r in runs if r["repeat"] == rep}
            value = by_strategy[name].get(key)
            if value is not None:
                out.append(value / by_strategy["ddp"]["samples_per_s"])
        return out

    if "rex" in args.compare:
        result["ratios"] = ratio("rex")
        result["ratio_rex_over_ddp"] = statistics.median(result["ratios"])
        if args.adaptive and (after := ratio("rex", "samples_per_s_after_first_accept")):
            result["ratio_rex_after_first_accept_over_ddp"] = statistics.median(after)
        if args.adaptive and (even := _headline_over_ddp(runs, args.repeat)):
            # the report's estimate of the even split's throughput over the paired ddp run's
            result["headline_even_over_ddp"] = even
    if "rex-static" in args.compare:
        result["ratios_rex_static"] = ratio("rex-static")
        result["ratio_rex_static_over_ddp"] = statistics.median(result["ratios_rex_static"])
    return result


def _headline_over_ddp(runs: list[dict[str, Any]], repeat: int) -> list[float]:
    """Per round: the report's even-split estimate (from rex's run) over ddp's measured rate."""
    out = []
    for rep in range(repeat):
        by = {r["strategy"]: r for r in runs if r["repeat"] == rep}
        est = by.get("rex", {}).get("headline_even_samples_per_s")
        if est and "ddp" in by:
            out.append(est[0] / by["ddp"]["samples_per_s"])
    return out


def run_emulation_check(
    args: argparse.Namespace,
    sizes: Sequence[str],
    thread_counts: Sequence[int],
    cases: Sequence[str] = ("plain",),
) -> list[dict[str, Any]]:
    """How slow the emulator makes each rank, as rex measures it, per model size and threads.

    Every run trains the even plan (so every rank has the same work) with the slowdowns and
    headroom of ``args``, monitored by a :class:`~lightning_rex.RexCallback`; a rank's
    achieved factor is the median, over the windows, of its median compute time over the
    fastest-asked rank's.

    Args:
        args: The parsed command line (slowdowns, headroom, steps, window, pinning).
        sizes: Names from :data:`MODEL_SIZES`.
        thread_counts: Torch threads per rank for each run (0: torch's default).
        cases: Model-code cases (:data:`~lightning_rex.tools.bench_cases.CASES`) to run each
            size and thread count with.

    Returns:
        One row per (case, size, threads): ``case``, ``size``, ``threads``, ``median_ms`` per
        rank, ``achieved`` and ``asked`` factors per rank.
    """
    rows = []
    slowdowns = list(args.slowdowns)
    base = slowdowns.index(min(slowdowns))
    runs = [(c, s, t) for c in cases for s in sizes for t in thread_counts]
    for case, size, threads in runs:
        width, depth = MODEL_SIZES[size]
        run_args = argparse.Namespace(**{**vars(args), "width": width, "depth": depth})
        run_args.threads, run_args.case = threads, case
        res = _run_once("emulation", run_args, None)
        windows = res["window_medians_ms"]
        ranks = range(len(slowdowns))
        rows.append(
            {
                "case": case,
                "size": size,
                "threads": threads,
                "median_ms": [statistics.median(w[r] for w in windows) for r in ranks],
                "achieved": [statistics.median(w[r] / w[base] for w in windows) for r in ranks],
                "asked": [s / slowdowns[base] for s in slowdowns],
                "windows": len(windows),
            }
        )
        _log(f"emulation {case} {size} threads={threads or 'default'}: {rows[-1]['achieved']}")
    return rows


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
