"""The examples' own logic: profile_curve's rank entry, the demo's paired ratios."""

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from tests.helpers.env import run_python

from lightning_rex.sim import scenario_from_dict

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_profile_curve_writes_a_rank_the_simulator_accepts(tmp_path):
    mod = load("profile_curve")
    out = tmp_path / "c.json"
    args = ["--model", "bench", "--sizes", "1,4,16", "--repeats", "2", "--warmup", "1"]
    assert mod.main([*args, "--out", str(out)]) == 0
    d = json.loads(out.read_text())
    rank = d["rank"]
    assert [b for b, _ in rank["curve"]] == [1, 4, 16] and rank["mem_cap"] == 16
    assert rank["device"] == "cpu" and d["shape_change_s"] >= 0.0
    s = scenario_from_dict({"global_batch": 16, "steps": 10, "ranks": [rank, rank]})
    assert s.base_times([8, 8]).shape == (2,)


def test_the_demo_reports_ratios_paired_within_rounds_and_names_its_static_plan():
    """Load moves whole rounds: the ratio of medians would mix rounds, the paired one not."""
    demo = load("quickstart")
    runs = []
    # round 0 on an idle machine, rounds 1 and 2 under load (everything 2x slower)
    for rep, scale in enumerate((1.0, 0.5, 0.5)):
        for name, rate in (("ddp", 600.0), ("rex", 1020.0), ("rex-static", 1080.0)):
            runs.append(
                {
                    "strategy": name,
                    "repeat": rep,
                    "samples_per_s": rate * scale * (1.1 if (rep, name) == (1, "rex") else 1),
                    "plan": [52, 12] if name != "ddp" else [32, 32],
                    "first_accept_step": 40 if name == "rex" else None,
                }
            )
    ratios = [1.7, 1.87, 1.7]
    result = {"runs": runs, "ratios": ratios, "ratios_rex_static": [1.8, 1.8, 1.8]}
    text = "\n".join(demo.summary(result, [52, 12], 5))
    assert "rex / ddp                 x1.70 (range x1.70-x1.87)" in text
    assert "rex / best static plan    x0.94 (range x0.94-x1.04)" in text
    assert "best static plan [52, 12]" in text and "fastest of 5" in text


def test_the_demos_bar_counts_steps_across_runs(capsys):
    demo = load("quickstart")
    bar = demo.Progress([("scan", 10), ("ddp", 30)])
    bar.step(1, 15)  # 10 + 15 of 40 steps, each run's start worth RUN_START steps
    bar.close()
    err = capsys.readouterr().err
    start = demo.RUN_START
    assert f"{(10 + 2 * start + 15) / (40 + 2 * start):4.0%}" in err
    assert "run 2/2 ddp, step 15" in err


@pytest.mark.distributed
def test_the_adaptive_cli_example_changes_the_plan_within_100_steps_and_says_so(tmp_path):
    """A real 2-rank fit of examples/cli/adaptive.yaml (rank 1 emulated 3x slower)."""
    cfg = EXAMPLES / "cli" / "adaptive.yaml"
    proc = run_python(
        str(EXAMPLES / "cli" / "train.py"),
        "fit",
        f"--config={cfg}",
        "--trainer.max_steps=100",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [
        x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("lightning-rex step")
    ]
    assert any(": new plan [" in x and "predicted" in x for x in lines), lines
    (log,) = tmp_path.rglob("rex_decisions.jsonl")
    records = [json.loads(x) for x in log.read_text().splitlines()]
    changes = [r for r in records if r["effective_step"] is not None]
    assert changes and changes[0]["effective_step"] < 100
    assert len(lines) == len([r for r in records if r["decision"] != "hold"])
    # the report of this real fit says what rex gained over the even split's estimate
    report = run_python("-m", "lightning_rex", "report", str(log.parent))
    assert report.returncode == 0, report.stderr
    page = (log.parent / "rex_report" / "index.html").read_text()
    assert "the even split (DDP&#x27;s) would have trained" in page, page[:2000]
