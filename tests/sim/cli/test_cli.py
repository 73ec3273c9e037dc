import json

import pytest
from tests.helpers.cli import run_command


def run_cli(argv, capsys):
    return run_command(["simulate", *argv], capsys)


def test_json_is_exactly_one_object_with_the_schema(capsys):
    rc, out, _ = run_cli(
        ["--scenario", "pair-3x", "--policy", "rex", "--seed", "1", "--steps", "300", "--json"],
        capsys,
    )
    assert rc == 0
    d = json.loads(out)
    assert d["scenario"] == "pair-3x" and d["seed"] == 1
    assert set(d["policies"]) == {"rex", "oracle"}
    keys = {
        "throughput",
        "limit_throughput",
        "efficiency",
        "steady_efficiency",
        "time_to_90pct_windows",
        "rescales",
        "plan_changes",
        "shape_change_s_total",
        "profile_s",
        "rollbacks",
        "false_rescales",
        "detection_delay_windows",
        "decision_ms_p50",
        "decision_ms_p99",
        "final_plan",
    }
    assert set(d["policies"]["rex"]) == keys
    assert d["policies"]["oracle"]["efficiency"] == 1.0
    assert d["policies"]["oracle"]["steady_efficiency"] == 1.0
    # the cold start from the even plan weighs on the whole run, not on the steady state
    rex = d["policies"]["rex"]
    assert rex["efficiency"] < rex["steady_efficiency"] <= 1.0


def test_compare_table(capsys):
    rc, out, _ = run_cli(
        ["--scenario", "pair-3x", "--compare", "even,proportional", "--steps", "300"], capsys
    )
    assert rc == 0
    for name in ("even", "proportional", "oracle"):
        assert name in out


def test_seed_sets_aggregate(capsys):
    rc, out, _ = run_cli(
        ["--scenario", "pair-3x", "--seeds", "0-1", "--steps", "300", "--json"], capsys
    )
    d = json.loads(out)
    assert rc == 0 and d["seeds"] == [0, 1] and "eff_mean" in d["policies"]["rex"]


def test_bad_scenario_and_policy(capsys, tmp_path):
    f = tmp_path / "s.json"
    f.write_text(json.dumps({"global_batch": 8, "steps": 30, "ranks": [], "x": 1}))
    rc, _, err = run_cli(["--scenario", str(f)], capsys)
    assert rc == 2 and "x" in err
    rc, _, err = run_cli(["--scenario", "pair-3x", "--compare", "rex,magic"], capsys)
    assert rc == 2 and "unknown policy 'magic'; choose from even" in err


def test_loop_overrides_change_when_plans_take_effect(capsys):
    base = ["--scenario", "pair-3x", "--policy", "proportional", "--steps", "300", "--json"]
    rc, out, _ = run_cli(base, capsys)
    rc_fast, out_fast, _ = run_cli([*base, "--warmup", "0", "--decision-lag", "1"], capsys)
    default, fast = (json.loads(o)["policies"]["proportional"] for o in (out, out_fast))
    assert rc == rc_fast == 0
    # the same policy, acting sooner: its first better plan runs for more of the 300 steps
    assert fast["throughput"] > default["throughput"]


def test_bad_loop_override_is_a_clear_error(capsys):
    rc, _, err = run_cli(["--scenario", "pair-3x", "--decision-lag", "0"], capsys)
    assert rc == 2 and "decision_lag must be in [1, segment=" in err


_RANK = {"rate": 1000.0, "overhead_s": 0.001}


def _json(d):
    return json.dumps(d).encode()


HOSTILE = {
    "malformed JSON": ("s.json", b'{"global_batch": 8, "steps": ', "invalid JSON: Expecting value"),
    "malformed YAML": ("s.yaml", b"a: [1, 2\n", "invalid YAML: while parsing a flow sequence"),
    "a binary file": ("s.json", bytes(range(128, 256)) * 8, "not a UTF-8 text file"),
    "nested too deeply": ("s.json", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    "a huge overhead": (
        "s.json",
        _json({"global_batch": 64, "steps": 100, "ranks": [{**_RANK, "overhead_s": 1e300}] * 2}),
        "ranks[0].overhead_s must be <= 10000, got 1e+300",
    ),
    "a huge cv": (
        "s.json",
        _json({"global_batch": 64, "steps": 100, "ranks": [_RANK] * 2, "noise": {"cv": 1e200}}),
        "noise.cv must be <= 10",
    ),
    "a vanishing rate": (
        "s.json",
        _json({"global_batch": 64, "steps": 100, "ranks": [{**_RANK, "rate": 1e-300}] * 2}),
        "ranks[0].rate must be >= 1e-12",
    ),
    "a huge global batch": (
        "s.json",
        _json({"global_batch": 10**12, "steps": 100, "ranks": [_RANK] * 2}),
        "global_batch must be <= 16,777,216",
    ),
    "too many ranks": (
        "s.json",
        _json({"global_batch": 20_000 * 8, "steps": 10, "ranks": [_RANK] * 20_000}),
        "ranks has 20000 entries; at most 16384",
    ),
    "an unbounded run": (
        "s.json",
        _json({"global_batch": 64, "steps": 1e12, "ranks": [_RANK] * 2}),
        "steps must be <= 1,000,000",
    ),
    "too many samples per rank": (
        "s.json",
        _json({"global_batch": 1 << 24, "steps": 60, "ranks": [{"rate": 1.0}, {"rate": 2.0}]}),
        "global_batch=16777216 over 2 ranks is more than 65,536 samples per rank",
    ),
    "too many rank-steps": (
        "s.json",
        _json({"global_batch": 8192 * 8, "steps": 5000, "ranks": [_RANK] * 8192}),
        "8192 ranks x 5000 steps exceeds the limit of 20,000,000 rank-steps",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_input_is_a_clear_message_and_exit_2(case, capsys, tmp_path):
    name, content, message = HOSTILE[case]
    f = tmp_path / name
    f.write_bytes(content)
    rc, out, err = run_cli(["--scenario", str(f)], capsys)
    assert rc == 2 and out == ""
    assert err.startswith(
        f"simulate: {f}: "
        if "file" in message or "invalid" in message or "nested" in message
        else "simulate: "
    )
    assert message in err and "Traceback" not in err


def test_a_comparison_reports_each_policy_against_rex(capsys):
    argv = ["--scenario", "pair-3x", "--compare", "even,rex", "--seeds", "0-2", "--steps", "300"]
    rc, out, _ = run_cli([*argv, "--json"], capsys)
    d = json.loads(out)["policies"]
    assert rc == 0 and d["rex"]["vs_rex"] == pytest.approx(1.0)
    lo, hi = d["even"]["vs_rex_ci95"]
    assert lo < d["even"]["vs_rex"] < hi < 1.0  # even is slower than rex on a 3x pair


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--seed", "-1"], "seed"),
        (["--seed", "x"], "seed"),
        (["--seeds", "a-b"], "seed"),
        (["--seeds", "5-0"], "A <= B"),
        (["--seeds", "0-99999999"], "at most"),
    ],
)
def test_bad_seeds_are_one_line_and_exit_2(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(["--scenario", "pair-3x", *argv], capsys)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert needle in err[-1] and "Traceback" not in "\n".join(err)


def test_an_unknown_policy_exits_2_naming_it(capsys):
    rc, _, err = run_cli(["--scenario", "pair-3x", "--compare", "rex,bogus"], capsys)
    assert rc == 2 and "'bogus'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_an_integer_too_long_to_convert_is_a_scenario_error(suffix, tmp_path, capsys):
    path = tmp_path / f"huge{suffix}"
    path.write_text('{"global_batch": ' + "9" * 5000 + "}")
    rc, _, err = run_cli(["--scenario", str(path)], capsys)
    assert rc == 2 and err.startswith("simulate:") and len(err.strip().splitlines()) == 1


def test_progress_on_a_terminal_quiet_otherwise(capsys, monkeypatch):
    # a 2-seed comparison tells a terminal how far it is (and what it runs) as it goes;
    # a log, a pipe or --json gets nothing on stderr
    import sys

    argv = ["--scenario", "pair-3x", "--compare", "even", "--seeds", "0-1", "--steps", "60"]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0 and "simulate" in err and "4/4" in err and "seed 1, oracle" in err
    rc, _, err = run_cli([*argv, "--json"], capsys)
    assert rc == 0 and err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    rc, _, err = run_cli(argv, capsys)
    assert rc == 0 and err == ""


def test_the_table_fits_100_columns_and_wide_shows_every_metric(capsys):
    for extra in ([], ["--seeds", "0-1"]):
        argv = ["--scenario", "pair-3x", "--compare", "even,static,proportional", "--steps", "90"]
        rc, out, _ = run_cli([*argv, *extra], capsys)
        assert rc == 0 and max(len(line) for line in out.splitlines()) <= 100, out
        assert "efficiency" in out or "eff_mean" in out
        rc, wide, _ = run_cli([*argv, *extra, "--wide"], capsys)
        assert rc == 0 and "decision_ms_p99" in wide and len(wide) > len(out)
