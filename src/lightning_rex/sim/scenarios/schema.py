"""Scenario files and mappings: validation with errors that name the field, and loading.

:func:`scenario_from_dict` checks a JSON/YAML mapping against the schema and the limits of
:mod:`lightning_rex.sim.scenarios.scenario` (whose docstring describes every field) and builds the
:class:`~lightning_rex.sim.scenarios.scenario.Scenario`; :func:`to_dict` is its inverse;
:func:`load_scenario` reads a preset name or a file, refusing malformed, binary or oversized
input with a :class:`~lightning_rex.sim.scenarios.scenario.ScenarioError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_rex.sim.scenarios.curves import TableCurve
from lightning_rex.sim.scenarios.fields import check_keys as _check_keys
from lightning_rex.sim.scenarios.fields import number as _num
from lightning_rex.sim.scenarios.memory import MAX_BYTES, memory_from_dict, pass_caps
from lightning_rex.sim.scenarios.noise import NoiseComponent, Spikes
from lightning_rex.sim.scenarios.scenario import (
    LIMITS,
    MAX_FILE_BYTES,
    MAX_GLOBAL_BATCH,
    MAX_PER_RANK,
    MAX_RANK_STEPS,
    MAX_RANKS,
    MAX_STEPS,
    EventSpec,
    NoiseSpec,
    RankSpec,
    Scenario,
    ScenarioError,
)
from lightning_rex.sim.scenarios.workload import workload_from_dict

__all__ = [
    "load_scenario",
    "scenario_from_dict",
    "to_dict",
    "with_noise",
    "with_shape_change",
    "with_steps",
]


def _rank_dict(r: RankSpec) -> dict[str, Any]:
    d: dict[str, Any]
    if r.curve is not None:
        d = {"curve": [list(p) for p in r.curve], "mem_cap": r.mem_cap}
    else:
        d = {"rate": r.rate, "overhead_s": r.overhead_s, "knee": r.knee, "mem_cap": r.mem_cap}
        if r.tile is not None:
            d["tile"] = r.tile
        if r.wave is not None:
            d["wave"] = {"size": r.wave[0], "share": r.wave[1]}
    if r.wall is not None:
        d["wall"] = {"start": r.wall[0], "factor": r.wall[1]}
    if r.device is not None:
        d["device"] = r.device
    if r.memory_bytes is not None:
        d["memory_bytes"] = r.memory_bytes
    return d


def _noise_dict(n: NoiseSpec) -> dict[str, Any]:
    d: dict[str, Any] = {"dist": n.dist, "cv": n.cv}
    if n.components is not None:
        d["components"] = [{"share": c.share, "ar1": c.ar1} for c in n.components]
    else:
        d["ar1"] = n.ar1
    if n.spikes is not None:
        d["spikes"] = {"prob": n.spikes.prob, "factor": n.spikes.factor}
    return d


def to_dict(s: Scenario) -> dict[str, Any]:
    """The JSON-able mapping of a scenario (inverse of :func:`scenario_from_dict`)."""
    d: dict[str, Any] = {
        "name": s.name,
        "global_batch": s.global_batch,
        "steps": s.steps,
        "window": s.window,
        "comm": s.comm,
        "min_size": s.min_size,
        "shape_change_s": s.shape_change_s,
        "shape_cache": s.shape_cache,
        "epoch_steps": s.epoch_steps,
        "ranks": [_rank_dict(r) for r in s.ranks],
        "noise": _noise_dict(s.noise),
        "events": [
            {"ranks": list(e.ranks), "start": e.start, "end": e.end, "factor": e.factor}
            for e in s.events
        ],
    }
    if s.workload is not None:
        w = s.workload
        d["workload"] = {
            "b0": w.b0,
            "target_progress": w.target_progress,
            "trace": [list(r) for r in w.trace],
            "batch_range": list(w.batch_range),
        }
    if s.memory is not None:
        d["memory"] = s.memory.to_dict()
    return d


_TOP = {
    "name",
    "global_batch",
    "steps",
    "window",
    "comm",
    "ranks",
    "noise",
    "events",
    "min_size",
    "shape_change_s",
    "shape_cache",
    "epoch_steps",
    "workload",
    "memory",
}
_RANK = {"rate", "overhead_s", "knee", "mem_cap", "tile", "wave", "curve", "wall", "device"}
_RANK |= {"memory_bytes"}
_AFFINE = {"rate", "overhead_s", "knee", "tile", "wave"}
_WALL = {"start", "factor"}
_WAVE = {"size", "share"}
_NOISE = {"dist", "cv", "ar1", "components", "spikes"}
_COMPONENT = {"share", "ar1"}
_SPIKES = {"prob", "factor"}
_EVENT = {"ranks", "start", "end", "factor"}


def _rank(r: Mapping[str, Any], where: str, cap: int | None) -> RankSpec:
    wall = None
    if "wall" in r:
        w = _check_keys(r["wall"], _WALL, f"{where}wall")
        if cap is None:
            raise ScenarioError(f"{where}wall needs {where}mem_cap: the wall rises towards it")
        start = _num(w, "start", f"{where}wall.", 0.8, lo=0.0, lo_open=True)
        if start >= 1.0:
            raise ScenarioError(f"{where}wall.start must be < 1, got {start}")
        wall = (start, _num(w, "factor", f"{where}wall.", 2.0, lo=1.0, hi=LIMITS["factor"]))
    device = r.get("device")
    if device is not None and (not isinstance(device, str) or not device):
        raise ScenarioError(f"{where}device must be a non-empty string, got {device!r}")
    mem = None
    if "memory_bytes" in r:
        mem = _num(r, "memory_bytes", where, lo=0.0, lo_open=True, hi=MAX_BYTES)
    if "curve" in r:
        both = sorted(_AFFINE & set(r))
        if both:
            raise ScenarioError(f"{where}curve replaces {where}{both[0]}: give one or the other")
        pts = r["curve"]
        if not isinstance(pts, list) or len(pts) > 4096:
            raise ScenarioError(f"{where}curve must be a list of at most 4096 [b, seconds] points")
        try:
            table = TableCurve(pts)
        except ValueError as e:
            raise ScenarioError(f"{where}curve: {e}") from e
        if max(t for _, t in table.points) > LIMITS["overhead_s"]:
            raise ScenarioError(f"{where}curve: times must be <= {LIMITS['overhead_s']:g} s")
        return RankSpec(mem_cap=cap, curve=table.points, wall=wall, device=device, memory_bytes=mem)
    tile = None
    if "tile" in r:
        tile = _num(r, "tile", where, lo=1, hi=MAX_GLOBAL_BATCH, integer=True)
    wave = None
    if "wave" in r:
        wd = _check_keys(r["wave"], _WAVE, f"{where}wave")
        wave = (
            _num(wd, "size", f"{where}wave.", lo=1, hi=MAX_GLOBAL_BATCH, integer=True),
            _num(wd, "share", f"{where}wave.", lo=0.0, hi=1.0),
        )
    return RankSpec(
        rate=_num(r, "rate", where, lo=1.0 / LIMITS["rate"], hi=LIMITS["rate"]),
        overhead_s=_num(r, "overhead_s", where, 0.0, lo=0.0, hi=LIMITS["overhead_s"]),
        knee=_num(r, "knee", where, 0, lo=0, hi=MAX_GLOBAL_BATCH, integer=True),
        mem_cap=cap,
        tile=tile,
        wave=wave,
        wall=wall,
        device=device,
        memory_bytes=mem,
    )


def _noise(d: Mapping[str, Any]) -> NoiseSpec:
    nd = _check_keys(d, _NOISE, "noise")
    dist = nd.get("dist", "lognormal")
    if dist != "lognormal":
        raise ScenarioError(f"noise.dist must be 'lognormal', got {dist!r}")
    cv = _num(nd, "cv", "noise.", 0.0, lo=0.0, hi=LIMITS["cv"])
    ar1 = _num(nd, "ar1", "noise.", 0.0, lo=0.0)
    if ar1 >= 1.0:
        raise ScenarioError(f"noise.ar1 must be in [0, 1), got {ar1}")
    comps = None
    if "components" in nd:
        if "ar1" in nd:
            raise ScenarioError("noise.components replaces noise.ar1: give one or the other")
        raw = nd["components"]
        if not isinstance(raw, list) or not 1 <= len(raw) <= 16:
            raise ScenarioError("noise.components must be a list of 1 to 16 components")
        comps = []
        for i, c in enumerate(raw):
            where = f"noise.components[{i}]."
            c = _check_keys(c, _COMPONENT, f"noise.components[{i}]")
            share = _num(c, "share", where, lo=0.0, lo_open=True, hi=1.0)
            a = _num(c, "ar1", where, lo=0.0)
            if a >= 1.0:
                raise ScenarioError(f"{where}ar1 must be in [0, 1), got {a}")
            comps.append(NoiseComponent(share, a))
        total = math.fsum(c.share for c in comps)
        if abs(total - 1.0) > 1e-9:
            raise ScenarioError(f"noise.components shares must sum to 1, got {total:.12g}")
    spikes = None
    if "spikes" in nd:
        sd = _check_keys(nd["spikes"], _SPIKES, "noise.spikes")
        prob = _num(sd, "prob", "noise.spikes.", lo=0.0, hi=1.0)
        factor = _num(sd, "factor", "noise.spikes.", lo=1.0 / LIMITS["factor"], hi=LIMITS["factor"])
        spikes = Spikes(prob, factor)
    return NoiseSpec(dist, cv, ar1, None if comps is None else tuple(comps), spikes)


def scenario_from_dict(d: Mapping[str, Any], name: str | None = None) -> Scenario:
    """Validate a mapping and build a :class:`Scenario`.

    Args:
        d: The parsed JSON/YAML mapping.
        name: A name to use when the mapping has none.

    Returns:
        The scenario.

    Raises:
        ScenarioError: Naming the field, for unknown keys, missing or out-of-range values,
            an empty rank list, infeasible bounds or events outside the run.
    """
    d = _check_keys(d, _TOP, "scenario")
    gb = _num(d, "global_batch", "", lo=1, hi=MAX_GLOBAL_BATCH, integer=True)
    steps = _num(d, "steps", "", lo=1, hi=MAX_STEPS, integer=True)
    window = _num(d, "window", "", 30, lo=1, hi=steps, integer=True)
    comm = _num(d, "comm", "", 0.0, lo=0.0, hi=LIMITS["comm"])
    min_size = _num(d, "min_size", "", 1, lo=1, hi=gb, integer=True)
    raw_ranks = d.get("ranks")
    if not isinstance(raw_ranks, list) or not raw_ranks:
        raise ScenarioError("ranks must be a non-empty list of rank mappings")
    if len(raw_ranks) > MAX_RANKS:
        raise ScenarioError(
            f"ranks has {len(raw_ranks)} entries; at most {MAX_RANKS} are simulated"
        )
    if gb > MAX_PER_RANK * len(raw_ranks):
        raise ScenarioError(
            f"global_batch={gb} over {len(raw_ranks)} ranks is more than {MAX_PER_RANK:,} "
            "samples per rank; add ranks or use a smaller global_batch"
        )
    if len(raw_ranks) * steps > MAX_RANK_STEPS:
        raise ScenarioError(
            f"{len(raw_ranks)} ranks x {steps} steps exceeds the limit of {MAX_RANK_STEPS:,} "
            "rank-steps; shorten the run (steps)"
        )
    ranks = []
    for i, r in enumerate(raw_ranks):
        where = f"ranks[{i}]."
        r = _check_keys(r, _RANK, f"ranks[{i}]")
        cap = r.get("mem_cap")
        if cap is not None:
            cap = _num(r, "mem_cap", where, lo=min_size, hi=MAX_GLOBAL_BATCH, integer=True)
        ranks.append(_rank(r, where, cap))
    n = len(ranks)
    if gb < n * min_size:
        raise ScenarioError(f"global_batch={gb} cannot give {n} ranks min_size={min_size}")
    caps = [min(r.mem_cap, gb) if r.mem_cap is not None else gb for r in ranks]
    if sum(caps) < gb:
        raise ScenarioError(f"ranks[*].mem_cap sum to {sum(caps)}, below global_batch={gb}")
    even_hi = -(-gb // n)
    small = [i for i, c in enumerate(caps) if c < even_hi]
    if small:
        raise ScenarioError(
            f"ranks[{small[0]}].mem_cap={caps[small[0]]} is below the even split {even_hi}"
        )
    noise = _noise(d.get("noise", {}))
    shape_change_s = _num(d, "shape_change_s", "", 0.0, lo=0.0, hi=LIMITS["overhead_s"])
    shape_cache = _num(d, "shape_cache", "", 8, lo=1, hi=4096, integer=True)
    epoch_steps = _num(d, "epoch_steps", "", 300, lo=1, hi=MAX_STEPS, integer=True)
    raw_events = d.get("events", [])
    if not isinstance(raw_events, list):
        raise ScenarioError("events must be a list")
    events = []
    for i, e in enumerate(raw_events):
        where = f"events[{i}]."
        e = _check_keys(e, _EVENT, f"events[{i}]")
        er = e.get("ranks")
        if (
            not isinstance(er, list)
            or not er
            or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < n for x in er)
        ):
            raise ScenarioError(
                f"{where}ranks must be a non-empty list of rank indices in [0, {n})"
            )
        start = _num(e, "start", where, lo=0, integer=True)
        end = _num(e, "end", where, lo=1, integer=True)
        if start >= steps or end > steps:
            raise ScenarioError(f"{where}start/end [{start}, {end}) outside the run [0, {steps})")
        if end <= start:
            raise ScenarioError(f"{where}end ({end}) must be greater than start ({start})")
        events.append(
            EventSpec(
                tuple(er),
                start,
                end,
                _num(e, "factor", where, lo=1.0 / LIMITS["factor"], hi=LIMITS["factor"]),
            )
        )
    workload = None
    if "workload" in d:
        workload = workload_from_dict(
            d["workload"], gb, n, min_size, [r.mem_cap for r in ranks], MAX_PER_RANK
        )
    memory = memory_from_dict(d["memory"]) if "memory" in d else None
    pass_caps([r.memory_bytes for r in ranks], memory)  # each rank holds one sample
    nm = d.get("name", name or "custom")
    return Scenario(
        gb,
        steps,
        tuple(ranks),
        window,
        comm,
        noise,
        tuple(events),
        min_size,
        str(nm),
        shape_change_s,
        shape_cache,
        epoch_steps,
        workload,
        memory,
    )


def load_scenario(spec: str) -> Scenario:
    """Load a scenario from a preset name or a ``.json`` / ``.yaml`` / ``.yml`` file.

    Args:
        spec: A preset name (see :data:`lightning_rex.sim.scenarios.presets.PRESETS`) or a path.

    Returns:
        The validated scenario.

    Raises:
        ScenarioError: For an unknown preset, a missing file or an invalid scenario.
    """
    from lightning_rex.sim.scenarios.presets import PRESETS

    if spec in PRESETS:
        return scenario_from_dict(PRESETS[spec](), name=spec)
    path = Path(spec)
    if not path.is_file():
        raise ScenarioError(f"scenario {spec!r} is neither a preset ({sorted(PRESETS)}) nor a file")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ScenarioError(
            f"{spec}: {size:,} bytes; a scenario file is at most {MAX_FILE_BYTES:,}"
        )
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{spec}: not a UTF-8 text file ({e.reason} at byte {e.start})") from e
    try:
        if path.suffix.lower() in {".yaml", ".yml"}:
            import yaml

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise ScenarioError(f"{spec}: invalid YAML: {' '.join(str(e).split())}") from e
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ScenarioError(
                    f"{spec}: invalid JSON: {e.msg} at line {e.lineno} column {e.colno}"
                ) from e
    except RecursionError as e:
        raise ScenarioError(f"{spec}: nested too deeply to be a scenario") from e
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise ScenarioError(f"{spec}: cannot be read as a scenario: {e}") from e
    return scenario_from_dict(data, name=path.stem)


def with_noise(s: Scenario, cv: float | None = None, ar1: float | None = None) -> Scenario:
    """A copy of a scenario with the noise overridden (None keeps a value).

    Args:
        s: The scenario.
        cv: New coefficient of variation.
        ar1: New AR(1) coefficient (replaces any noise components).

    Returns:
        The validated copy.
    """
    d = to_dict(s)
    if cv is not None:
        d["noise"]["cv"] = cv
    if ar1 is not None:  # one AR(1) process in place of any components
        d["noise"].pop("components", None)
        d["noise"]["ar1"] = ar1
    return scenario_from_dict(d)


def with_shape_change(s: Scenario, seconds: float) -> Scenario:
    """A copy of a scenario that charges ``seconds`` for a new micro-batch shape.

    Args:
        s: The scenario.
        seconds: The new ``shape_change_s`` (>= 0).

    Returns:
        The validated copy.
    """
    d = to_dict(s)
    d["shape_change_s"] = seconds
    return scenario_from_dict(d)


def with_steps(s: Scenario, steps: int) -> Scenario:
    """A copy of a scenario with another run length (events must still fit).

    Args:
        s: The scenario.
        steps: The new number of steps.

    Returns:
        The validated copy.
    """
    d = to_dict(s)
    d["steps"] = steps
    return scenario_from_dict(d)
