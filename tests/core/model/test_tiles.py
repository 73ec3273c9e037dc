"""The tile hypotheses of the time model: padding, evidence, and which tile the data show."""

import numpy as np
import pytest
import torch

from lightning_rex.core.model.tiles import HYPOTHESES, pad, pads
from lightning_rex.core.model.time_model import RankTimeModel


def test_pad_is_the_distance_to_the_tiles_end_in_units_of_b_ref():
    b = torch.tensor([1.0, 31.0, 32.0, 33.0, 64.0])
    np.testing.assert_allclose(pad(b, 32, 16.0).numpy(), [31 / 16, 1 / 16, 0.0, 31 / 16, 0.0])
    assert pad(b, None, 16.0).abs().sum() == 0
    both = pads(torch.tensor([33.0]), (16, 64), 1.0)
    np.testing.assert_allclose(both.numpy(), [[15.0, 31.0]])
    per_rank = pad(torch.tensor([[9.0, 17.0], [9.0, 17.0]]), torch.tensor([8, 16]), 1.0)
    np.testing.assert_allclose(per_rank.numpy(), [[7.0, 7.0], [7.0, 15.0]])


def _staircase_model(
    tile: int | None, sizes: list[int], wave: int | None = None, seed: int = 0
) -> RankTimeModel:
    """Two ranks of one kind whose times step every ``tile`` samples (None: smooth).

    With a wave, 30% of the work runs in whole waves of ``wave`` samples.
    """
    rng = np.random.default_rng(seed)
    m = RankTimeModel(2, 256, 255, groups=["G", "G"])
    for b in sizes:
        eff = b if tile is None else int(np.ceil(b / tile) * tile)
        if wave is not None:
            eff = 0.7 * eff + 0.3 * np.ceil(b / wave) * wave
        t = (0.005 + eff / 2000.0) * np.exp(rng.normal(0.0, 0.003, 2))
        m.add((b, b), t, 0.003**2)
    return m


@pytest.mark.parametrize("tile", [16, 32, 64])
def test_a_staircase_is_recognised_and_its_tiles_end_is_predicted_flat(tile: int) -> None:
    m = _staircase_model(tile, [100, 120, 90, 128, 70, 129, 110, 96, 60, 140])
    assert tuple(m.tile[0]) == (tile, 1) and m.tile_weights[0, HYPOTHESES.index((tile, 1))] > 0.9
    end = 128  # a multiple of every tile tried
    t = m.predict_grid(np.array([end - tile + 1, end, end + 1]))[0][0]
    assert t[1] == pytest.approx(t[0], rel=0.01)  # flat inside the tile
    assert t[2] > t[1] * (1.0 + 0.5 * tile / 2000.0 / t[1])  # the jump after its end


def test_a_smooth_curve_keeps_no_tile() -> None:
    m = _staircase_model(None, [100, 120, 90, 128, 70, 129, 110, 96, 60, 140])
    assert tuple(m.tile[0]) == (1, 1) and m.tile_weights[0, 0] > 0.9


def test_two_sizes_are_no_evidence_of_a_tile() -> None:
    m = _staircase_model(64, [100, 128, 100, 128, 100, 128])
    np.testing.assert_allclose(m.tile_weights[:, 0], 1.0)


def test_a_wave_on_a_tile_is_recognised_and_priced_past_its_end() -> None:
    sizes = [100, 120, 90, 128, 70, 129, 110, 96, 60, 140, 150, 136]
    m = _staircase_model(16, sizes, wave=64)
    assert tuple(m.tile[0]) == (16, 64)
    t = m.predict_grid(np.array([113, 128, 129, 144]))[0][0]
    assert t[1] == pytest.approx(t[0], rel=0.01)  # one tile and one wave
    jump = (0.7 * 16 + 0.3 * 64) / 2000.0
    assert t[2] - t[1] == pytest.approx(jump, rel=0.3)  # a new tile and a new wave
    assert t[3] == pytest.approx(t[2], rel=0.01)


def _distinct_reference(b, prec, group, pooled):  # type: ignore[no-untyped-def]
    """Distinct live sizes per rank (its pooled group's union), with sets."""
    live = prec > 1e-6 * prec.max(dim=-1, keepdim=True).values
    sizes = [set(r) - {0} for r in torch.where(live, b, 0).round().long().tolist()]
    united: dict[int, set[int]] = {}
    for r, k in enumerate(group.tolist()):
        if pooled[r]:
            united.setdefault(int(k), set()).update(sizes[r])
    return np.array([len(united[k]) if pooled[r] else len(sizes[r]) for r, k in enumerate(group)])


@pytest.mark.parametrize("seed", range(5))
def test_distinct_sizes_count_each_owners_live_sizes_once(seed: int) -> None:
    from lightning_rex.core.model.tiles import _distinct_sizes

    rng = np.random.default_rng(seed)
    for _ in range(40):
        n, w = int(rng.integers(1, 30)), int(rng.integers(1, 10))
        lead = np.array([rng.integers(0, r + 1) for r in range(n)])
        group = np.array([g if lead[g] == g else r for r, g in enumerate(lead)])
        pooled = np.bincount(group, minlength=n)[group] >= 3
        b = torch.as_tensor(rng.integers(0, 6, (n, w)).astype(float))
        prec = torch.as_tensor(rng.choice([0.0, 1e-9, 1.0, 2.0], (n, w)))
        got = _distinct_sizes(b, prec, group, pooled)
        np.testing.assert_array_equal(got, _distinct_reference(b, prec, group, pooled))
