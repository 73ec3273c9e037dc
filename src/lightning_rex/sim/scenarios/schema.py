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
    data: dict[str, Any]
    if r.curve is not None:
        data = {"curve": [list(p) for p in r.curve], "mem_cap": r.mem_cap}
    else:
        data = {"rate": r.rate, "overhead_s": r.overhead_s, "knee": r.knee, "mem_cap": r.mem_cap}
        if r.tile is not None:
            data["tile"] = r.tile
        if r.wave is not None:
            data["wave"] = {"size": r.wave[0], "share": r.wave[1]}
    if r.wall is not None:
        data["wall"] = {"start": r.wall[0], "factor": r.wall[1]}
    if r.device is not None:
        data["device"] = r.device
    if r.memory_bytes is not None:
        data["memory_bytes"] = r.memory_bytes
    return data


def _noise_dict(n: NoiseSpec) -> dict[str, Any]:
    data: dict[str, Any] = {"dist": n.dist, "cv": n.cv}
    if n.components is not None:
        data["components"] = [{"share": c.share, "ar1": c.ar1} for c in n.components]
    else:
        data["ar1"] = n.ar1
    if n.spikes is not None:
        data["spikes"] = {"prob": n.spikes.prob, "factor": n.spikes.factor}
    return data


def to_dict(s: Scenario) -> dict[str, Any]:
    """The JSON-able mapping of a scenario (inverse of :func:`scenario_from_dict`)."""
    data: dict[str, Any] = {
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
        workload = s.workload
        data["workload"] = {
            "b0": workload.b0,
            "target_progress": workload.target_progress,
            "trace": [list(r) for r in workload.trace],
            "batch_range": list(workload.batch_range),
        }
    if s.memory is not None:
        data["memory"] = s.memory.to_dict()
    return data


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
        wall_map = _check_keys(r["wall"], _WALL, f"{where}wall")
        if cap is None:
            raise ScenarioError(f"{where}wall needs {where}mem_cap: the wall rises towards it")
        start = _num(wall_map, "start", f"{where}wall.", 0.8, lo=0.0, lo_open=True)
        if start >= 1.0:
            raise ScenarioError(f"{where}wall.start must be < 1, got {start}")
        wall = (start, _num(wall_map, "factor", f"{where}wall.", 2.0, lo=1.0, hi=LIMITS["factor"]))
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
        except ValueError as err:
            raise ScenarioError(f"{where}curve: {err}") from err
        if max(t for _, t in table.points) > LIMITS["overhead_s"]:
            raise ScenarioError(f"{where}curve: times must be <= {LIMITS['overhead_s']:g} s")
        return RankSpec(mem_cap=cap, curve=table.points, wall=wall, device=device, memory_bytes=mem)
    tile = None
    if "tile" in r:
        tile = _num(r, "tile", where, lo=1, hi=MAX_GLOBAL_BATCH, integer=True)
    wave = None
    if "wave" in r:
        wave_map = _check_keys(r["wave"], _WAVE, f"{where}wave")
        wave = (
            _num(wave_map, "size", f"{where}wave.", lo=1, hi=MAX_GLOBAL_BATCH, integer=True),
            _num(wave_map, "share", f"{where}wave.", lo=0.0, hi=1.0),
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
    fields = _check_keys(d, _NOISE, "noise")
    dist = fields.get("dist", "lognormal")
    if dist != "lognormal":
        raise ScenarioError(f"noise.dist must be 'lognormal', got {dist!r}")
    noise_cv = _num(fields, "cv", "noise.", 0.0, lo=0.0, hi=LIMITS["cv"])
    ar1 = _num(fields, "ar1", "noise.", 0.0, lo=0.0)
    if ar1 >= 1.0:
        raise ScenarioError(f"noise.ar1 must be in [0, 1), got {ar1}")
    comps = None
    if "components" in fields:
        if "ar1" in fields:
            raise ScenarioError("noise.components replaces noise.ar1: give one or the other")
        raw = fields["components"]
        if not isinstance(raw, list) or not 1 <= len(raw) <= 16:
            raise ScenarioError("noise.components must be a list of 1 to 16 components")
        comps = []
        for index, component in enumerate(raw):
            where = f"noise.components[{index}]."
            component = _check_keys(component, _COMPONENT, f"noise.components[{index}]")
            share = _num(component, "share", where, lo=0.0, lo_open=True, hi=1.0)
            comp_ar1 = _num(component, "ar1", where, lo=0.0)
            if comp_ar1 >= 1.0:
                raise ScenarioError(f"{where}ar1 must be in [0, 1), got {comp_ar1}")
            comps.append(NoiseComponent(share, comp_ar1))
        total = math.fsum(c.share for c in comps)
        if abs(total - 1.0) > 1e-9:
            raise ScenarioError(f"noise.components shares must sum to 1, got {total:.12g}")
    spikes = None
    if "spikes" in fields:
        spikes_map = _check_keys(fields["spikes"], _SPIKES, "noise.spikes")
        prob = _num(spikes_map, "prob", "noise.spikes.", lo=0.0, hi=1.0)
        limit = LIMITS["factor"]
        factor = _num(spikes_map, "factor", "noise.spikes.", lo=1.0 / limit, hi=limit)
        spikes = Spikes(prob, factor)
    return NoiseSpec(dist, noise_cv, ar1, None if comps is None else tuple(comps), spikes)


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
    data = _check_keys(d, _TOP, "scenario")
    batch = _num(data, "global_batch", "", lo=1, hi=MAX_GLOBAL_BATCH, integer=True)
    steps = _num(data, "steps", "", lo=1, hi=MAX_STEPS, integer=True)
    window = _num(data, "window", "", 30, lo=1, hi=steps, integer=True)
    comm = _num(data, "comm", "", 0.0, lo=0.0, hi=LIMITS["comm"])
    min_size = _num(data, "min_size", "", 1, lo=1, hi=batch, integer=True)
    raw_ranks = data.get("ranks")
    if not isinstance(raw_ranks, list) or not raw_ranks:
        raise ScenarioError("ranks must be a non-empty list of rank mappings")
    if len(raw_ranks) > MAX_RANKS:
        raise ScenarioError(
            f"ranks has {len(raw_ranks)} entries; at most {MAX_RANKS} are simulated"
        )
    if batch > MAX_PER_RANK * len(raw_ranks):
        raise ScenarioError(
            f"global_batch={batch} over {len(raw_ranks)} ranks is more than "
            f"{MAX_PER_RANK:,} samples per rank; add ranks or use a smaller global_batch"
        )
    if len(raw_ranks) * steps > MAX_RANK_STEPS:
        raise ScenarioError(
            f"{len(raw_ranks)} ranks x {steps} steps exceeds the limit of {MAX_RANK_STEPS:,} "
            "rank-steps; shorten the run (steps)"
        )
    ranks = []
    for index, rank_map in enumerate(raw_ranks):
        where = f"ranks[{index}]."
        rank_map = _check_keys(rank_map, _RANK, f"ranks[{index}]")
        cap = rank_map.get("mem_cap")
        if cap is not None:
            cap = _num(rank_map, "mem_cap", where, lo=min_size, hi=MAX_GLOBAL_BATCH, integer=True)
        ranks.append(_rank(rank_map, where, cap))
    nranks = len(ranks)
    if batch < nranks * min_size:
        raise ScenarioError(f"global_batch={batch} cannot give {nranks} ranks min_size={min_size}")
    caps = [min(r.mem_cap, batch) if r.mem_cap is not None else batch for r in ranks]
    if sum(caps) < batch:
        raise ScenarioError(f"ranks[*].mem_cap sum to {sum(caps)}, below global_batch={batch}")
    even_hi = -(-batch // nranks)
    small = [i for i, c in enumerate(caps) if c < even_hi]
    if small:
        raise ScenarioError(
            f"ranks[{small[0]}].mem_cap={caps[small[0]]} is below the even split {even_hi}"
        )
    noise = _noise(data.get("noise", {}))
    shape_change_s = _num(data, "shape_change_s", "", 0.0, lo=0.0, hi=LIMITS["overhead_s"])
    shape_cache = _num(data, "shape_cache", "", 8, lo=1, hi=4096, integer=True)
    epoch_steps = _num(data, "epoch_steps", "", 300, lo=1, hi=MAX_STEPS, integer=True)
    raw_events = data.get("events", [])
    if not isinstance(raw_events, list):
        raise ScenarioError("events must be a list")
    events = []
    for index, event in enumerate(raw_events):
        where = f"events[{index}]."
        event = _check_keys(event, _EVENT, f"events[{index}]")
        picked = event.get("ranks")
        if (
            not isinstance(picked, list)
            or not picked
            or any(
                isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < nranks for x in picked
            )
        ):
            raise ScenarioError(
                f"{where}ranks must be a non-empty list of rank indices in [0, {nranks})"
            )
        start = _num(event, "start", where, lo=0, integer=True)
        end = _num(event, "end", where, lo=1, integer=True)
        if start >= steps or end > steps:
            raise ScenarioError(f"{where}start/end [{start}, {end}) outside the run [0, {steps})")
        if end <= start:
            raise ScenarioError(f"{where}end ({end}) must be greater than start ({start})")
        events.append(
            EventSpec(
                tuple(picked),
                start,
                end,
                _num(event, "factor", where, lo=1.0 / LIMITS["factor"], hi=LIMITS["factor"]),
            )
        )
    workload = None
    if "workload" in data:
        workload = workload_from_dict(
            data["workload"], batch, nranks, min_size, [r.mem_cap for r in ranks], MAX_PER_RANK
        )
    memory = memory_from_dict(data["memory"]) if "memory" in data else None
    pass_caps([r.memory_bytes for r in ranks], memory)  # each rank holds one sample
    scenario_name = data.get("name", name or "custom")
    return Scenario(
        batch,
        steps,
        tuple(ranks),
        window,
        comm,
        noise,
        tuple(events),
        min_size,
        str(scenario_name),
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
    except UnicodeDecodeError as err:
        raise ScenarioError(
            f"{spec}: not a UTF-8 text file ({err.reason} at byte {err.start})"
        ) from err
    try:
        if path.suffix.lower() in {".yaml", ".yml"}:
            import yaml

            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as err:
                raise ScenarioError(f"{spec}: invalid YAML: {' '.join(str(err).split())}") from err
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise ScenarioError(
                    f"{spec}: invalid JSON: {err.msg} at line {err.lineno} column {err.colno}"
                ) from err
    except RecursionError as err:
        raise ScenarioError(f"{spec}: nested too deeply to be a scenario") from err
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise ScenarioError(f"{spec}: cannot be read as a scenario: {err}") from err
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
    data = to_dict(s)
    if cv is not None:
        data["noise"]["cv"] = cv
    if ar1 is not None:  # one AR(1) process in place of any components
        data["noise"].pop("components", None)
        data["noise"]["ar1"] = ar1
    return scenario_from_dict(data)


def with_shape_change(s: Scenario, seconds: float) -> Scenario:
    """A copy of a scenario that charges ``seconds`` for a new micro-batch shape.

    Args:
        s: The scenario.
        seconds: The new ``shape_change_s`` (>= 0).

    Returns:
        The validated copy.
    """
    data = to_dict(s)
    data["shape_change_s"] = seconds
    return scenario_from_dict(data)


def with_steps(s: Scenario, steps: int) -> Scenario:
    """A copy of a scenario with another run length (events must still fit).

    Args:
        s: The scenario.
        steps: The new number of steps.

    Returns:
        The validated copy.
    """
    data = to_dict(s)
    data["steps"] = steps
    return scenario_from_dict(data)
