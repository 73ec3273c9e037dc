"""HeterogeneityEmulator: factors, validation, and where and how much it delays."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tests.helpers.trainer import quiet_trainer
from torch.utils.data import DataLoader, TensorDataset

import lightning as L
from lightning_rex import HeterogeneityEmulator
from lightning_rex.measure import timing as timing_module
from lightning_rex.measure.timing import ComputeTimer
from lightning_rex.tools import stretch as stretch_module
from lightning_rex.tools.bench import BenchModel


def test_factor_combines_slowdown_and_active_events() -> None:
    emu = HeterogeneityEmulator(
        [1.0, 2.0],
        events=[
            {"ranks": [1], "start": 10, "end": 20, "factor": 3.0},
            {"ranks": [0, 1], "start": 15, "end": 16, "factor": 2.0},
        ],
    )
    assert emu.factor(1, 9) == 2.0
    assert emu.factor(1, 10) == 6.0
    assert emu.factor(1, 15) == 12.0
    assert emu.factor(0, 15) == 2.0
    assert emu.factor(1, 20) == 2.0  # end is exclusive


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"slowdowns": [1.0, 0.5]}, "slowdowns must all be >= 1.0"),
        (
            {"events": [{"ranks": [1], "start": 5, "end": 5, "factor": 2}]},
            r"events\[0\] needs 0 <= start < end",
        ),
        (
            {"events": [{"ranks": [1], "start": 0, "end": 5, "factor": 0}]},
            r"events\[0\].factor must be > 0",
        ),
        (
            {"events": [{"ranks": [1], "start": 0, "end": 5, "factor": 2, "when": 1}]},
            r"events\[0\] has unknown keys \['when'\]",
        ),
        (
            {"events": [{"ranks": [1], "start": 0, "factor": 2}]},
            r"events\[0\] is missing \['end'\]",
        ),
        (
            {"events": [{"ranks": [], "start": 0, "end": 1, "factor": 2}]},
            r"events\[0\].ranks must be a non-empty list",
        ),
        ({"headroom": 0.5}, "headroom must be a finite number >= 1, got 0.5"),
        ({"headroom": float("inf")}, "headroom must be a finite number >= 1, got inf"),
        ({"headroom": float("nan")}, "headroom must be a finite number >= 1, got nan"),
        ({"headroom": True}, "headroom must be a number >= 1 or None, got True"),
        ({"headroom": "2"}, "headroom must be a number >= 1 or None, got '2'"),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        HeterogeneityEmulator(**kwargs)


class _Delays(HeterogeneityEmulator):
    """Records each step's delay, and how much of it a DDP reducer's hook had seen."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.per_step: list[tuple[int, float, float]] = []
        self._nodes: list[Any] = []
        self._before = self._seen = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        for p in pl_module.parameters():
            # DDP's reducer learns that a gradient is ready from a post hook on the
            # parameter's AccumulateGrad node, and holds the node (one no one holds is rebuilt)
            node = p.view_as(p).grad_fn.next_functions[0][0]
            node.register_hook(self._reducer_hook)
            self._nodes.append(node)

    def _reducer_hook(self, *_: Any) -> None:
        self._seen = self.total_delay_s

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._before = self._seen = self.total_delay_s

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_after_backward(trainer, pl_module)
        delay, seen = self.total_delay_s - self._before, self._seen - self._before
        self.per_step.append((trainer.global_step, delay, seen))


class _Clock:
    """Stands in for the emulator's ``time`` module: time passes only when the test says so.

    Args:
        load: Wall time per second of work: another process shares the core, so the rank's
            work of ``w`` seconds takes ``load x w`` seconds of wall time and ``w`` of CPU.
        backward_load: The load during backward passes (default: ``load``).
    """

    def __init__(self, load: float = 1.0, backward_load: float | None = None) -> None:
        self.t = 0.0
        self.cpu = 0.0
        self.load = load
        self.forward_load = load
        self.backward_load = load if backward_load is None else backward_load

    def perf_counter(self) -> float:
        return self.t

    def thread_time(self) -> float:
        return self.cpu

    def work(self, seconds: float) -> None:
        self.cpu += seconds
        self.t += seconds * self.load

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class _Work(torch.autograd.Function):
    """Identity whose forward and backward take work on the fake clock."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, clock: _Clock, per_sample: float) -> torch.Tensor:
        ctx.clock, ctx.n, ctx.per_sample = clock, len(x), per_sample
        clock.load = clock.forward_load
        clock.work(per_sample * len(x))
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        clock = ctx.clock
        clock.load = clock.backward_load
        clock.work(2 * ctx.per_sample * ctx.n)  # before any parameter's gradient is ready
        return grad, None, None


class _Kernels(torch.nn.Module):
    """A module with a parameter whose computation takes work on the fake clock."""

    def __init__(self, clock: _Clock) -> None:
        super().__init__()
        self.clock = clock
        self.scale = torch.nn.Parameter(torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Work.apply(x, self.clock, 0.001) * self.scale


class _TimedModel(BenchModel):
    """On the fake clock, its forward takes 1 ms of work per sample and its backward twice that.

    The work is inside a module's computation, where a slower device is slower; the step's
    Python around it takes no time on the fake clock.
    """

    def __init__(self, clock: _Clock | None, unused: bool = False) -> None:
        super().__init__(width=64, depth=2)
        self.clock = clock
        self.kernels = None if clock is None else _Kernels(clock)
        self.unused = torch.nn.Parameter(torch.zeros(1)) if unused else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        return logits if self.kernels is None else self.kernels(logits)


def _fit(
    emu: HeterogeneityEmulator,
    batch: int,
    steps: int = 6,
    clock: _Clock | None = None,
    unused: bool = False,
    model: _TimedModel | None = None,
) -> None:
    torch.set_num_threads(1)
    n = batch * steps
    ds = TensorDataset(torch.randn(n, 16, 32), torch.randint(0, 10, (n,)))
    t = quiet_trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        callbacks=[emu],
    )
    t.fit(model or _TimedModel(clock, unused), DataLoader(ds, batch_size=batch))


def test_delay_only_inside_events_and_before_the_all_reduce_sees_the_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the injected clock: on a loaded machine the real one can find an event step's compute
    # already lasting f x headroom times its CPU work (the load did it), and nothing is slept
    clock = _Clock()
    monkeypatch.setattr(stretch_module, "time", clock)
    events = [{"ranks": [0], "start": 2, "end": 4, "factor": 3.0}]
    emu = _Delays([1.0], events=events, headroom=1.0)
    _fit(emu, batch=8, clock=clock)
    for step, delay, seen in emu.per_step:
        assert (delay > 0) == (2 <= step < 4)
        # the reducer's hook of the last gradient fires after the sleep: the all-reduce waits
        assert seen == delay


@pytest.mark.parametrize("batch", [2, 256])
def test_delay_is_the_extra_compute_of_a_slower_device(
    batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slowdown 3: (3 - 1) x (forward + backward) = 2 x 3 ms per sample, every step."""
    clock = _Clock()
    monkeypatch.setattr(stretch_module, "time", clock)
    emu = _Delays([3.0], headroom=1.0)
    _fit(emu, batch=batch, clock=clock)
    assert [d for _, d, _ in emu.per_step] == pytest.approx([0.006 * batch] * 6)
    assert [s for _, _, s in emu.per_step] == pytest.approx([0.006 * batch] * 6)
    assert emu.total_delay_s == pytest.approx(6 * 0.006 * batch)


def test_backward_ratio_is_deprecated() -> None:
    with pytest.warns(FutureWarning, match="backward_ratio=...\\) is ignored"):
        emu = HeterogeneityEmulator([3.0], backward_ratio=0.5)
    assert emu.slowdowns == (3.0,)


class _Phases(HeterogeneityEmulator):
    """Records each step's compute phase (batch start to the end of backward) on the clock."""

    def __init__(self, clock: _Clock, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.clock = clock
        self.phases: list[float] = []
        self._t0 = 0.0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._t0 = self.clock.t

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_after_backward(trainer, pl_module)
        self.phases.append(self.clock.t - self._t0)


@pytest.mark.parametrize(
    ("slowdown", "headroom", "load"),
    [
        (3.0, 1.0, 1.0),
        (3.0, 1.0, 2.0),
        (3.0, 1.0, 3.0),
        (1.0, 2.0, 1.0),
        (1.0, 2.0, 2.0),
        (1.0, 1.0, 2.0),
        (1.0, 2.0, 3.0),
        (2.0, 2.0, 3.0),
    ],
)
def test_a_process_sharing_the_core_changes_no_step_within_the_headroom(
    slowdown: float, headroom: float, load: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compute phase lasts ``slowdown x headroom`` times the work (3 ms a sample here),
    however much wall time the work took, up to that much: a rank that gets half its core
    (load 2) is not emulated twice as slow; beyond it the load shows, as on real hardware."""
    clock = _Clock(load)
    monkeypatch.setattr(stretch_module, "time", clock)
    emu = _Phases(clock, [slowdown], headroom=headroom)
    _fit(emu, batch=8, clock=clock)
    work = 0.003 * 8
    expected = max(slowdown * headroom, load) * work
    assert emu.phases == pytest.approx([expected] * 6)


@pytest.mark.parametrize(("forward_load", "backward_load"), [(1.0, 2.0), (2.0, 1.0), (1.0, 1.5)])
def test_a_load_that_comes_with_the_backward_only_changes_no_step(
    forward_load: float, backward_load: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that takes the core while the rank sleeps slows the backward, not the
    forward: the backward is measured, not predicted from the forward's pace."""
    clock = _Clock(forward_load, backward_load)
    monkeypatch.setattr(stretch_module, "time", clock)
    emu = _Phases(clock, [3.0], headroom=1.0)
    _fit(emu, batch=8, clock=clock)
    assert emu.phases == pytest.approx([3.0 * 0.003 * 8] * 6)


def test_a_parameter_without_a_gradient_moves_the_sleep_after_the_backward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last expected gradient never comes: the step still lasts 3 x its work."""
    clock = _Clock()
    monkeypatch.setattr(stretch_module, "time", clock)
    emu = _Phases(clock, [3.0], headroom=1.0)
    _fit(emu, batch=8, clock=clock, unused=True)
    assert emu.phases == pytest.approx([3.0 * 0.003 * 8] * 6)


class _RexTiming(L.Callback):
    """Times each step's compute as a RexCallback does, with a ComputeTimer."""

    def __init__(self) -> None:
        self.timer: ComputeTimer | None = None
        self.seconds: list[float] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.timer = ComputeTimer(pl_module.device)
        self.timer.attach(pl_module.parameters())

    def on_train_batch_start(self, *_: Any) -> None:
        assert self.timer is not None
        self.timer.start()

    def on_train_batch_end(self, *_: Any) -> None:
        assert self.timer is not None
        self.timer.stop()
        self.seconds += self.timer.resolve([self.timer.take_step()])


@pytest.mark.parametrize("rex_first", [True, False])
def test_rex_measures_the_emulated_compute_in_either_callback_order(
    rex_first: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sleep comes before the last gradient is accumulated, so before the hook that ends
    rex's compute time, whichever callback registered its hooks first."""
    clock = _Clock(load=2.0)
    monkeypatch.setattr(stretch_module, "time", clock)
    monkeypatch.setattr(timing_module, "time", clock)
    emu, rex = HeterogeneityEmulator([3.0], headroom=1.0), _RexTiming()
    torch.set_num_threads(1)
    ds = TensorDataset(torch.randn(48, 16, 32), torch.randint(0, 10, (48,)))
    t = quiet_trainer(
        accelerator="cpu", devices=1, max_steps=6, callbacks=[rex, emu] if rex_first else [emu, rex]
    )
    t.fit(_TimedModel(clock), DataLoader(ds, batch_size=8))
    assert rex.seconds == pytest.approx([3.0 * 0.003 * 8] * 6)


def test_a_cpu_rank_is_emulated_at_half_its_cores_speed_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a headroom, a CPU rank's compute lasts slowdown x 2 times its work, so a load
    that takes up to half the core changes no step (here: the rank gets half its core)."""
    clock = _Clock(load=2.0)
    monkeypatch.setattr(stretch_module, "time", clock)
    emu = _Phases(clock, [1.0])
    _fit(emu, batch=8, clock=clock)
    assert emu.headroom is None and emu.headroom_in_use == 2.0
    assert emu.phases == pytest.approx([2.0 * 0.003 * 8] * 6)


@pytest.mark.parametrize(("load", "warns"), [(2.0, False), (2.15, False), (3.0, True)])
def test_a_load_beyond_the_headroom_warns_once_with_the_headroom_that_absorbs_it(
    load: float, warns: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = _Clock(load)
    monkeypatch.setattr(stretch_module, "time", clock)
    emu = _Phases(clock, [1.0], headroom=2.0)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fit(emu, batch=4, steps=30, clock=clock)
    mine = [w for w in caught if "HeterogeneityEmulator" in str(w.message)]
    assert len(mine) == int(warns), [str(w.message) for w in mine]
    if warns:
        text = str(mine[0].message)
        assert "rank 0's compute took 3.0x its CPU work" in text
        assert "slowdown 1 x headroom 2" in text
        assert "HeterogeneityEmulator(headroom=4)" in text  # 1.1 x 3.0, rounded up
    # within the headroom the steps are the emulated device's; beyond it the load shows
    assert emu.phases == pytest.approx([max(2.0, load) * 0.003 * 4] * 30)


def test_slowdowns_must_match_world_size() -> None:
    with pytest.raises(
        ValueError, match="slowdowns must have one entry per rank: the world size is 1"
    ):
        _fit(HeterogeneityEmulator([1.0, 3.0]), batch=4)
