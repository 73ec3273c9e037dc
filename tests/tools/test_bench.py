"""The bench CLI: one JSON object on stdout with the documented schema; clear argument errors."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
from typing import Any

import pytest

from lightning_rex.__main__ import main
from lightning_rex.tools.bench import pin_rank

pytestmark = pytest.mark.distributed


def test_json_schema_with_static_and_adaptive_rex() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_rex",
            "bench",
            "--compare",
            "ddp,rex,rex-static",
            "--adaptive",
            "--window",
            "5",
            "--devices",
            "2",
            "--slowdowns",
            "1,2",
            "--steps",
            "16",
            "--warmup",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    result = json.loads(proc.stdout)  # stdout holds exactly one JSON object
    assert proc.stdout.strip().count("\n") == 0
    runs = {r["strategy"]: r for r in result["runs"]}
    assert set(runs) == {"ddp", "rex", "rex-static"}
    for r in runs.values():
        assert r["repeat"] == 0 and r["samples_per_s"] > 0 and r["step_ms_median"] > 0
        assert sum(r["plan"]) == 64 and len(r["plan"]) == 2
    assert runs["ddp"]["plan"] == [32, 32]
    assert runs["rex-static"]["plan"] == [43, 21]  # proportional to 1 / slowdown
    assert runs["rex"]["adaptive"] is True and "adaptive" not in runs["rex-static"]
    history = runs["rex"]["plan_history"]
    assert history[0] == [0, [32, 32]] and all(sum(p) == 64 for _, p in history)
    assert result["ratio_rex_over_ddp"] == pytest.approx(
        runs["rex"]["samples_per_s"] / runs["ddp"]["samples_per_s"]
    )
    assert "ratio_rex_static_over_ddp" in result


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--slowdowns", "1,2,3"], "--slowdowns needs 2 values"),
        (["--micro-batch-sizes", "40,20"], "--micro-batch-sizes needs 2 values summing to 64"),
        (["--compare", "ddp,horovod"], "unknown: \\['horovod'\\]"),
        (["--steps", "10", "--warmup", "10"], "--warmup must be in"),
    ],
)
def test_bad_arguments(argv: list[str], match: str) -> None:
    with pytest.raises(SystemExit, match=match):
        main(["bench", *argv])


@pytest.mark.parametrize(
    ("flag", "value", "match"),
    [
        ("--headroom", "0.5", "must be a finite number >= 1, got 0.5"),
        ("--headroom", "inf", "got inf"),
        ("--headroom", "nan", "got nan"),
        ("--headroom", "two", "not a number: 'two'"),
        ("--depth", "0", "must be at least 1, got 0"),
        ("--depth", "2.5", "not an integer: '2.5'"),
    ],
)
def test_a_bad_headroom_or_depth_is_one_line_and_exit_2(
    flag: str, value: str, match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in err and match in err


def _affinity_after_pin(q: Any, rank: int, world: int) -> None:
    q.put((pin_rank(rank, world), sorted(os.sched_getaffinity(0))))


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_pin_rank_pins_to_the_ranks_own_core() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")  # pin a child, never the test process
    q = ctx.Queue()
    for rank, world, expect in ((1, 2, [cpus[1 % len(cpus)]]), (0, len(cpus) + 1, cpus)):
        p = ctx.Process(target=_affinity_after_pin, args=(q, rank, world))
        p.start()
        pinned, affinity = q.get(timeout=30)
        p.join()
        assert affinity == expect
        assert pinned == (world <= len(cpus))


def test_steps_are_reported_from_inside_each_run(tmp_path) -> None:
    """Progress within a run: rank 0's process calls ``on_step`` after every step."""
    from lightning_rex.tools import bench, bench_cli

    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        [
            "bench",
            "--compare",
            "ddp,rex-static",
            "--slowdowns",
            "1,2",
            "--steps",
            "6",
            "--warmup",
            "1",
        ]
    )
    log = tmp_path / "steps.txt"

    def on_step(run: int, done: int) -> None:  # runs in the forked rank 0
        with log.open("a") as f:
            f.write(f"{run} {done}\n")

    bench.run_benchmark(args, progress=lambda *_: None, on_step=on_step)
    seen = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    assert seen == [(run, step) for run in (0, 1) for step in range(1, 7)]
