"""A simulated cluster: :class:`Scenario`, every field it holds and what it means.

A scenario is a JSON or YAML mapping::

    {"global_batch": 512, "steps": 3000, "window": 30, "comm": 0.01,
     "ranks": [{"rate": 2000.0, "overhead_s": 0.004, "knee": 32, "mem_cap": 512}, ...],
     "noise": {"dist": "lognormal", "cv": 0.15, "ar1": 0.5},
     "events": [{"ranks": [2], "start": 1000, "end": 3000, "factor": 1.6}]}

Rank ``r``'s noise-free compute time for micro-batch ``b`` is one of (see
:mod:`lightning_rex.sim.scenarios.curves`):

* affine: ``overhead_s + max(b, knee) / rate`` (rate in samples/s); with ``"tile": T``,
  ``overhead_s + ceil(max(b, knee) / T) * T / rate`` (a quantisation staircase); with
  ``"wave": {"size": W, "share": f}`` the share ``f`` of that work runs in whole waves of
  ``W`` samples instead (a second, coarser staircase: a wave that is not full costs a full
  one);
* measured: ``"curve": [[b, seconds], ...]`` instead of ``rate``/``overhead_s``/``knee``/
  ``tile``/``wave`` (at least 2 points, ``b`` strictly increasing, times > 0): monotone
  PCHIP between the points, flat below the first, linear from the last two above the last;

times, with ``"wall": {"start": 0.8, "factor": 2.0}`` (needs ``mem_cap``), a memory wall
that multiplies the time by ``1 + (factor - 1) * ((b / mem_cap - start) / (1 - start))**2``
above ``start * mem_cap``. ``b`` may not exceed ``mem_cap`` (a hard bound). ``"device": "name"``
labels the ranks that share hardware. ``comm`` seconds are added to every synchronous step.

Memory as a soft bound: ``"memory_bytes"`` on a rank (its device's memory) with a top-level
``"memory": {"fixed_bytes": F, "per_sample_bytes": P}`` gives the rank a pass cap
``c = floor((memory_bytes - F) / P)`` (see :mod:`lightning_rex.sim.scenarios.memory`): a micro-batch
``b > c`` runs as ``ceil(b / c)`` accumulation passes, as even as possible, and the rank's
time is the sum of its passes' times, each from its curve at the pass size
(:mod:`lightning_rex.core.passes`).

``noise`` multiplies each rank's time by a mean-one lognormal factor of coefficient of
variation ``cv`` whose log follows an AR(1) process per rank (``ar1``), or, with
``"components": [{"share": s, "ar1": a}, ...]`` instead of ``ar1``, a sum of independent
AR(1) processes carrying ``share`` of the log-variance each (shares sum to 1); with
``"spikes": {"prob": p, "factor": f}`` every rank, every step, independently takes ``f``
times its time with probability ``p`` (see :mod:`lightning_rex.sim.scenarios.noise`). ``events``
multiply the listed ranks' time by ``factor`` for steps in ``[start, end)`` (overlapping
events multiply). ``window`` is the number of steps per observation window.

Costs every policy pays: ``shape_change_s`` seconds are added to a rank's step when its
micro-batch size is not one of the last ``shape_cache`` (default 8) distinct sizes it ran
(cuDNN autotuning, ``torch.compile`` recompiles, CUDA-graph capture); default 0. The sizes of
the initial plan are warm. ``epoch_steps`` (default 300) is an epoch's length in steps, for
policies that act once per epoch.

``workload`` (optional) gives a training job's gradient statistics and a target: the run
then ends when that target is reached, and global batch policies are compared by their time
to it (see :mod:`lightning_rex.sim.scenarios.workload` and
:mod:`lightning_rex.sim.engine.goodput`); ``steps`` is then the most steps a run may take.

Optional keys: ``name``, ``min_size`` (default 1). Unknown keys, negative rates, an empty rank
list or events outside the run raise :class:`ScenarioError` naming the field.

Limits, so that a run's time and memory stay bounded (each is checked with a clear error):
at most :data:`MAX_RANKS` ranks, :data:`MAX_STEPS` steps and :data:`MAX_RANK_STEPS` ranks x
steps; ``global_batch`` at most :data:`MAX_GLOBAL_BATCH` and :data:`MAX_PER_RANK` per rank;
every time, rate and factor in a
range where step times stay finite (see :data:`LIMITS`). Memory grows with ranks x the sizes
that matter (the planners tabulate each rank's curve only up to the largest size a rank
could take without being slower than the even plan), not with ranks x ``global_batch``. A
file larger than :data:`MAX_FILE_BYTES`, one that is not UTF-8, or malformed JSON/YAML is a
:class:`ScenarioError` too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from lightning_rex.core.passes import cap_array, pass_split, pass_total
from lightning_rex.sim.scenarios.curves import TableCurve, affine_times, memory_wall_factor
from lightning_rex.sim.scenarios.errors import ScenarioError
from lightning_rex.sim.scenarios.memory import MemorySpec
from lightning_rex.sim.scenarios.memory import pass_caps as memory_pass_caps
from lightning_rex.sim.scenarios.noise import NoiseComponent, NoiseProcess, Spikes
from lightning_rex.sim.scenarios.workload import Workload

__all__ = [
    "LIMITS",
    "MAX_FILE_BYTES",
    "MAX_GLOBAL_BATCH",
    "MAX_PER_RANK",
    "MAX_RANKS",
    "MAX_RANK_STEPS",
    "MAX_STEPS",
    "EventSpec",
    "NoiseSpec",
    "RankSpec",
    "Scenario",
    "ScenarioError",
]


MAX_RANKS = 16_384
"""The most ranks a scenario may have."""
MAX_STEPS = 1_000_000
"""The longest run, in steps."""
MAX_RANK_STEPS = 20_000_000
"""The most ranks x steps (about two and a half minutes of this machine's CPU)."""
MAX_GLOBAL_BATCH = 1 << 24
"""The largest global batch."""
MAX_PER_RANK = 1 << 16
"""The largest global batch per rank (``global_batch / ranks``): planners tabulate sizes."""
MAX_FILE_BYTES = 10 << 20
"""The largest scenario file read."""
LIMITS: dict[str, float] = {
    "rate": 1e12,
    "overhead_s": 1e4,
    "comm": 1e4,
    "cv": 10.0,
    "factor": 1e6,
}
"""Upper bounds of the numeric fields (rates are also at least ``1 / LIMITS["rate"]``, and
event factors at least ``1 / LIMITS["factor"]``)."""


@dataclass(frozen=True)
class RankSpec:
    """One simulated rank.

    Attributes:
        rate: Samples per second above the knee (> 0).
        overhead_s: Fixed seconds per step (>= 0).
        knee: Below this micro-batch the GPU is under-filled and time stays flat (>= 0).
        mem_cap: The largest micro-batch that fits in memory, or None.
        tile: The quantisation tile of the affine form, or None.
        wave: The affine form's ``(samples per wave, share of the work)``, or None.
        curve: Measured ``(b, seconds)`` points replacing the affine form, or None.
        wall: The memory wall's ``(start, factor)``, or None.
        device: The hardware label (ranks with the same label share a device type), or None.
        memory_bytes: The device's memory in bytes (its pass cap follows from the scenario's
            ``memory``), or None.
    """

    rate: float = 1.0
    overhead_s: float = 0.0
    knee: int = 0
    mem_cap: int | None = None
    tile: int | None = None
    wave: tuple[int, float] | None = None
    curve: tuple[tuple[float, float], ...] | None = None
    wall: tuple[float, float] | None = None
    device: str | None = None
    memory_bytes: float | None = None


@dataclass(frozen=True)
class NoiseSpec:
    """Multiplicative per-rank noise.

    Attributes:
        dist: Only ``"lognormal"``.
        cv: Coefficient of variation of the factor (>= 0).
        ar1: Lag-1 autocorrelation of the log factor, in ``[0, 1)`` (one component).
        components: AR(1) components of the log factor instead of ``ar1``, or None.
        spikes: Independent per-rank, per-step spikes, or None.
    """

    dist: str = "lognormal"
    cv: float = 0.0
    ar1: float = 0.0
    components: tuple[NoiseComponent, ...] | None = None
    spikes: Spikes | None = None

    def process(self, n_ranks: int, rng: np.random.Generator) -> NoiseProcess:
        """The noise process of ``n_ranks`` ranks drawing from ``rng``.

        Args:
            n_ranks: The number of ranks.
            rng: The generator.

        Returns:
            The process (one AR(1) component ``ar1`` unless ``components`` are given).
        """
        comps = self.components or (NoiseComponent(1.0, self.ar1),)
        return NoiseProcess(n_ranks, self.cv, comps, self.spikes, rng)


@dataclass(frozen=True)
class EventSpec:
    """Slow (or speed) the listed ranks by ``factor`` for steps in ``[start, end)``.

    Attributes:
        ranks: Affected rank indices.
        start: First affected step.
        end: One past the last affected step.
        factor: Multiplier of the compute time (> 0).
    """

    ranks: tuple[int, ...]
    start: int
    end: int
    factor: float


class _Curves:
    """Every rank's noise-free curve, vectorised: affine ranks at once, tables by group."""

    def __init__(
        self, ranks: tuple[RankSpec, ...], pass_caps: list[int | None] | None = None
    ) -> None:
        self.caps = cap_array(pass_caps, len(ranks))
        self.rate = np.array([r.rate for r in ranks])
        self.over = np.array([r.overhead_s for r in ranks])
        self.knee = np.array([r.knee for r in ranks])
        tiles = np.array([r.tile or 0 for r in ranks])
        self.tile = tiles if tiles.any() else None
        waves = np.array([r.wave[0] if r.wave else 0 for r in ranks])
        self.wave = waves if waves.any() else None
        self.wave_share = np.array([r.wave[1] if r.wave else 0.0 for r in ranks])
        groups: dict[tuple[tuple[float, float], ...], list[int]] = {}
        for index, rank in enumerate(ranks):
            if rank.curve is not None:
                groups.setdefault(rank.curve, []).append(index)
        self.tables = [(TableCurve(pts), np.array(ix)) for pts, ix in groups.items()]
        walled = [i for i, r in enumerate(ranks) if r.wall is not None]
        self.walled = np.array(walled, dtype=int)
        self.wall_cap = np.array([ranks[i].mem_cap for i in walled], dtype=float)
        self.wall_start = np.array([ranks[i].wall[0] for i in walled])  # type: ignore[index]
        self.wall_factor = np.array([ranks[i].wall[1] for i in walled])  # type: ignore[index]

    def table(self, sizes: np.ndarray) -> np.ndarray:
        """Every rank's time at every size in ``sizes``, shape ``(N, len(sizes))``."""
        sizes = np.asarray(sizes)
        return self.steps(np.broadcast_to(sizes[None, :], (self.rate.size, sizes.size)))

    def __call__(self, plan: np.ndarray) -> np.ndarray:
        return self.steps(np.asarray(plan))

    def steps(self, b: np.ndarray) -> np.ndarray:
        """Step times at per-rank sizes ``(N,)`` or ``(N, G)``: the sum of each step's passes."""
        if self.caps is None:
            return self.single(b)
        caps = self.caps.reshape((-1,) + (1,) * (b.ndim - 1))
        n_passes, pass_size, n_larger = pass_split(b, caps)
        return pass_total(
            n_passes,
            n_larger,
            self.single(pass_size),
            self.single(np.where(n_larger > 0, pass_size + 1, pass_size)),
        )

    def single(self, b: np.ndarray) -> np.ndarray:
        """One pass's times at per-rank sizes ``b``, shape ``(N,)`` or ``(N, G)``."""

        def col(x: np.ndarray) -> np.ndarray:
            return x.reshape((-1,) + (1,) * (b.ndim - 1))

        times = affine_times(
            b,
            overhead_s=col(self.over),
            rate=col(self.rate),
            knee=col(self.knee),
            tile=None if self.tile is None else col(self.tile),
            wave=None if self.wave is None else col(self.wave),
            wave_share=col(self.wave_share),
        )
        for curve, rows in self.tables:
            times[rows] = curve(b[rows])
        if self.walled.size:
            times[self.walled] *= memory_wall_factor(
                b[self.walled],
                mem_cap=col(self.wall_cap),
                start=col(self.wall_start),
                factor=col(self.wall_factor),
            )
        return times


@dataclass(frozen=True)
class Scenario:
    """A validated scenario (see the module docstring for the meaning of each field)."""

    global_batch: int
    steps: int
    ranks: tuple[RankSpec, ...]
    window: int = 30
    comm: float = 0.0
    noise: NoiseSpec = field(default_factory=NoiseSpec)
    events: tuple[EventSpec, ...] = ()
    min_size: int = 1
    name: str = "custom"
    shape_change_s: float = 0.0
    shape_cache: int = 8
    epoch_steps: int = 300
    workload: Workload | None = None
    memory: MemorySpec | None = None

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return len(self.ranks)

    @property
    def max_sizes(self) -> list[int | None]:
        """Per-rank hard caps (``mem_cap``)."""
        return [r.mem_cap for r in self.ranks]

    @cached_property
    def pass_caps(self) -> list[int | None] | None:
        """Per-rank pass caps from the memory fields (soft), or None when none is given."""
        return memory_pass_caps([r.memory_bytes for r in self.ranks], self.memory)

    def compute_times(self, plan: np.ndarray, step: int) -> np.ndarray:
        """Noise-free compute times of every rank at ``step`` under ``plan``, seconds.

        Args:
            plan: Per-rank sizes, shape ``(N,)``.
            step: The global step (selects the active events).

        Returns:
            Shape ``(N,)``.
        """
        return self.base_times(plan) * self.factors(step)

    def time_table(self, sizes: np.ndarray, step: int) -> np.ndarray:
        """Noise-free times of every rank at every size in ``sizes`` at ``step``, seconds.

        Args:
            sizes: Micro-batch sizes, shape ``(G,)``.
            step: The global step (selects the active events).

        Returns:
            Shape ``(N, G)``.
        """
        return self._curves.table(np.asarray(sizes)) * self.factors(step)[:, None]

    def base_times(self, plan: np.ndarray) -> np.ndarray:
        """Noise-free, event-free compute times of every rank under ``plan``, seconds.

        Args:
            plan: Per-rank sizes, shape ``(N,)``.

        Returns:
            Shape ``(N,)``.
        """
        return self._curves(np.asarray(plan))

    @cached_property
    def _curves(self) -> _Curves:
        return _Curves(self.ranks, self.pass_caps)

    @property
    def devices(self) -> tuple[str | None, ...]:
        """Per-rank hardware labels."""
        return tuple(r.device for r in self.ranks)

    def factors(self, step: int) -> np.ndarray:
        """The product of active event factors per rank at ``step``, shape ``(N,)``."""
        product = np.ones(self.world_size)
        for event in self.events:
            if event.start <= step < event.end:
                product[list(event.ranks)] *= event.factor
        return product

    def event_active(self, step: int) -> bool:
        """Whether any event covers ``step``."""
        return any(e.start <= step < e.end for e in self.events)
