"""The controller's statistical targets on small fixed seed sets (seconds, not benchmarks)."""

from lightning_rex.sim import run, scenario_from_dict

RANKS = [{"rate": 2000.0, "overhead_s": 0.005, "knee": 16, "mem_cap": 512}] * 16
NOISE = {"dist": "lognormal", "cv": 0.10, "ar1": 0.5}
SEEDS = range(8)


def test_persistent_15pct_slowdown_acted_on_within_3_windows():
    s = scenario_from_dict(
        {
            "global_batch": 1024,
            "steps": 330,
            "window": 30,
            "comm": 0.01,
            "ranks": RANKS,
            "noise": NOISE,
            "events": [{"ranks": [5], "start": 180, "end": 330, "factor": 1.15}],
        }
    )
    delays = [run(s, "rex", seed).detection_delay_windows[0] for seed in range(20)]
    # The target is >= 95%; it is measured on 60 seeds by the CLI (docs/simulator.md). A set
    # of 20 seeds in seconds cannot resolve 95%, so this guards against regressions at 90%.
    assert sum(d is not None and d <= 3 for d in delays) >= 18, delays


def test_transients_of_one_window_or_less_are_not_acted_on():
    events = [
        {"ranks": [2], "start": 90, "end": 120, "factor": 1.6},  # exactly one window
        {"ranks": [7], "start": 225, "end": 255, "factor": 1.6},  # straddles a boundary
        {"ranks": [11], "start": 370, "end": 390, "factor": 1.6},  # inside one window
    ]
    s = scenario_from_dict(
        {
            "global_batch": 1024,
            "steps": 480,
            "window": 30,
            "comm": 0.01,
            "ranks": RANKS,
            "noise": NOISE,
            "events": events,
        }
    )
    acted = [d for seed in SEEDS for d in run(s, "rex", seed).detection_delay_windows]
    assert sum(d is not None and d <= 3 for d in acted) == 0, acted


def test_noise_only_never_rescales():
    s = scenario_from_dict(
        {
            "global_batch": 512,
            "steps": 600,
            "window": 30,
            "comm": 0.008,
            "ranks": RANKS[:8],
            "noise": {"dist": "lognormal", "cv": 0.3, "ar1": 0.5},
        }
    )
    assert sum(run(s, "rex", seed).rescales for seed in SEEDS) == 0
