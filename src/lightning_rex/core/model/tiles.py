"""Tile staircases in the time model: the candidate tiles, their evidence, their mixture.

GPU kernels pad a micro-batch to a multiple of a tile (tensor-core and GEMM tiles of 8 to
128 samples), so a rank's step time is flat inside a tile and jumps at its end: a
staircase, which no smooth curve represents. The time model
(:class:`~lightning_rex.core.model.time_model.RankTimeModel`) carries two more features for
it, the paddings ``pad_T(b) = ceil(b / T) T - b`` and ``pad_W(b)`` (relative to ``b_ref``)
of a tile ``T`` and of a coarser wave ``W`` (kernels whose thread blocks fill the GPU's SMs
``W`` samples at a time: a second, larger jump when a wave is started). With coefficients
equal to the slope time is affine in the padded size; the coefficients are learned, so a
tile or wave the data do not show has no effect.

Which tile? Every entry of :data:`HYPOTHESES`, a ``(tile, wave)`` pair of :data:`TILES`
(1: none), is a hypothesis. Its evidence is the rank's log marginal likelihood under the
same Bayesian linear regression as the posterior, maximised over a few residual scales (a
scale fitted under one hypothesis would favour it), plus its log prior
(:data:`LOG_PRIOR`: no tile nine times as likely as all the others together; a wave on top
of a tile less likely again). Ranks of one device kind pool their evidence (a tile belongs to
the kernels of a kind: the windows of at most :data:`EVIDENCE_MEMBERS` members are one data
set, so that the kind's sizes together show its staircase).
A tile is a candidate only where the windows that still count ran at three sizes or more, a
tile and a wave at four. The hypotheses' posterior weights are then used as they are: the
model predicts the weighted mixture of their posteriors (Bayesian model averaging), so a
size just past a tile's end is priced by the chance that the tile is real, and a tile's end
is preferred in proportion, while one strong jump soon makes its tile the only one that
counts.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "EVIDENCE_MEMBERS",
    "HYPOTHESES",
    "LOG_PRIOR",
    "MAX_MIXTURE",
    "MIN_WEIGHT",
    "PADS",
    "TILES",
    "hypothesis_weights",
    "log_evidence",
    "pad",
    "pad_prior",
    "pads",
]

TILES = (1, 8, 16, 32, 64, 128, 256)
"""Tile and wave sizes, in samples, a rank's curve may be quantised to (1: none)."""
HYPOTHESES: tuple[tuple[int, int], ...] = (
    (1, 1),
    *((t, 1) for t in TILES[1:]),
    *((t, w) for t in TILES[1:] for w in TILES[1:] if w > t),
)
"""``(tile, wave)`` pairs: no tile, a tile alone, or a tile with a coarser wave."""
LOG_PRIOR = np.log([0.9 if h == (1, 1) else 0.015 if h[1] == 1 else 0.01 / 15 for h in HYPOTHESES])
"""Prior log probabilities of :data:`HYPOTHESES` (they sum to 1)."""
SCALES = (1e-5, 1e-4, 1e-3, 1e-2, 0.1)
"""Residual variances (relative) each hypothesis's evidence is maximised over."""
MIN_WEIGHT = 0.01
"""A rank's hypotheses weighing less than this are left out of its mixture."""
MAX_MIXTURE = 3
"""A rank's mixture keeps at most this many hypotheses (its most probable ones)."""
POOL = 2
"""Device groups of at least this many ranks pool their evidence."""
EVIDENCE_MEMBERS = 8
"""A pooled group's evidence is computed on the windows of at most this many members."""
PADS = slice(2, 4)
"""The columns of the time model's features that hold the tile's and the wave's padding."""
WAVE_SHARE = 0.3
"""The prior mean of the share of a step's work that runs in waves, under a wave hypothesis."""


def pad(b: torch.Tensor, tile: int | torch.Tensor | None, b_ref: float) -> torch.Tensor:
    """The padding a kernel with tile ``tile`` adds to ``b`` samples, relative to ``b_ref``.

    Args:
        b: Sizes, any shape.
        tile: A tile for all sizes, one per rank (aligned with ``b``'s first dimension), or
            None (no tile: zeros). A tile of 1 pads nothing.
        b_ref: The unit.

    Returns:
        ``(ceil(b / T) T - b) / b_ref``, the shape of ``b``.
    """
    import torch

    if tile is None:
        return torch.zeros_like(b)
    tile_size = torch.as_tensor(tile, dtype=b.dtype)
    if tile_size.dim() == 1:
        tile_size = tile_size.view(-1, *([1] * (b.dim() - 1)))
    return (torch.ceil(b / tile_size) * tile_size - b) / b_ref


def pads(b: torch.Tensor, hypothesis: Any, b_ref: float) -> torch.Tensor:
    """The tile's and the wave's paddings of ``b`` under a hypothesis, stacked last.

    Args:
        b: Sizes, any shape.
        hypothesis: A ``(tile, wave)`` pair for all sizes, an ``(N, 2)`` array of them (one
            per rank, aligned with ``b``'s first dimension), or None (no tile).
        b_ref: The unit.

    Returns:
        Shape ``b.shape + (2,)``.
    """
    import torch

    if hypothesis is None:
        return torch.zeros(*b.shape, 2, dtype=b.dtype)
    pair_array = np.asarray(hypothesis, dtype=np.float64)
    tile, wave = (torch.as_tensor(pair_array[..., i]) for i in (0, 1))
    return torch.stack([pad(b, tile, b_ref), pad(b, wave, b_ref)], dim=-1)


def pad_prior(m0: torch.Tensor, hypothesis: tuple[int, int]) -> torch.Tensor:
    """Prior means of the weights under a hypothesis: the paddings cost what samples cost.

    A kernel computes on the padded batch, so a tile's padding costs about the slope (the
    prior mean of column 1), shared with a wave's as ``1 - WAVE_SHARE`` to ``WAVE_SHARE``.
    The prior variances stay wide (the data set the costs); this mean is what lets a tile
    still seen in the evidence price a jump where recent windows are few.

    Args:
        m0: Prior means with zero padding costs, ``(N, D)``.
        hypothesis: ``(tile, wave)``.

    Returns:
        The prior means under the hypothesis, ``(N, D)``.
    """
    tile, wave = hypothesis
    out = m0.clone()
    if tile > 1:
        share = WAVE_SHARE if wave > 1 else 0.0
        out[:, PADS.start] = m0[:, 1] * (1.0 - share)
        out[:, PADS.start + 1] = m0[:, 1] * share
    return out


def log_evidence(
    phi: torch.Tensor, y: torch.Tensor, prec: torch.Tensor, m0: torch.Tensor, p0: torch.Tensor
) -> torch.Tensor:
    """Each rank's log marginal likelihood of ``y = phi w + e`` (Gaussian prior and noise).

    Terms that every model of the same data shares are left out.

    Args:
        phi: Features, ``(N, W, D)``.
        y: Observations, ``(N, W)``.
        prec: Their precisions, ``(N, W)``.
        m0: Prior means of the weights, ``(N, D)``.
        p0: Prior variances of the weights, ``(N, D)``.

    Returns:
        Shape ``(N,)``.
    """
    import torch

    prior_prec = 1.0 / p0
    gram = phi.transpose(-1, -2) @ (prec.unsqueeze(-1) * phi)
    rhs = m0 * prior_prec + (phi * (prec * y).unsqueeze(-1)).sum(-2)
    chol = torch.linalg.cholesky(torch.diag_embed(prior_prec) + gram)
    post_mean = torch.cholesky_solve(rhs.unsqueeze(-1), chol).squeeze(-1)
    fit = -0.5 * (
        (prec * y * y).sum(-1) + (m0 * m0 * prior_prec).sum(-1) - (post_mean * rhs).sum(-1)
    )
    logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    return fit - 0.5 * (logdet + torch.log(p0).sum(-1))


def _distinct_sizes(
    b: torch.Tensor, prec: torch.Tensor, group: np.ndarray, pooled: np.ndarray
) -> np.ndarray:
    """Distinct sizes among each rank's windows that still count (its group's, when pooled)."""
    live = (prec > 1e-6 * prec.max(dim=-1, keepdim=True).values).numpy()
    sizes = b.round().long().numpy()
    num_ranks = len(group)
    # one owner per pooled group and per unpooled rank; a size counts once per owner
    owner = np.where(pooled, group, num_ranks + np.arange(num_ranks)).astype(np.int64)
    keep = live & (sizes != 0)
    top = int(sizes.max(initial=0)) + 1
    pairs = np.unique(np.broadcast_to(owner[:, None], sizes.shape)[keep] * top + sizes[keep])
    return np.bincount(pairs // top, minlength=2 * num_ranks)[owner]


def hypothesis_weights(
    phi: torch.Tensor,
    b: torch.Tensor,
    y: torch.Tensor,
    prec: torch.Tensor,
    m0: torch.Tensor,
    p0: torch.Tensor,
    group: np.ndarray,
    b_ref: float,
) -> np.ndarray:
    """Each rank's posterior probability of every hypothesis in :data:`HYPOTHESES`.

    Args:
        phi: The windows' features without padding (zeros in the :data:`PADS` columns),
            ``(N, W, D)``; the residual's columns follow the pads.
        b: The windows' sizes, ``(N, W)``.
        y: Their medians (relative), ``(N, W)``.
        prec: Their precisions, ``(N, W)``.
        m0: Prior means of the weights, ``(N, D)``.
        p0: Prior variances of the weights, ``(N, D)``.
        group: Each rank's device group (the index of a member), shape ``(N,)``.
        b_ref: The unit of the paddings.

    Returns:
        Shape ``(N, len(HYPOTHESES))``, rows summing to 1: each rank's posterior, cut to its
        :data:`MAX_MIXTURE` most probable hypotheses of at least :data:`MIN_WEIGHT`.
    """
    import torch

    num_ranks = len(group)
    counts = np.bincount(group, minlength=num_ranks)
    pooled = counts[group] >= POOL
    # one data set per unpooled rank, and one per pooled group: the windows of a few of its
    # members side by side (a kind's sizes together show its staircase, where each member's
    # few sizes fit a smooth curve as well)
    sets: dict[int, list[int]] = {}
    for rank, group_id in enumerate(group.tolist()):
        key = int(group_id) if pooled[rank] else -1 - rank
        members = sets.setdefault(key, [])
        if len(members) < EVIDENCE_MEMBERS:
            members.append(rank)
    keys = list(sets)
    row_of_key = {k: i for i, k in enumerate(keys)}
    row_of = np.array(
        [row_of_key[int(g) if pooled[r] else -1 - r] for r, g in enumerate(group.tolist())]
    )
    n_win = b.shape[1]
    length = n_win * max(len(m) for m in sets.values())
    shape = (len(keys), length)
    phi_s = torch.zeros(*shape, phi.shape[-1], dtype=phi.dtype)
    b_s = torch.ones(shape, dtype=b.dtype)
    y_s = torch.zeros(shape, dtype=y.dtype)
    prec_s = torch.zeros(shape, dtype=prec.dtype)  # padding: no data
    for row, set_key in enumerate(keys):
        member_ranks = torch.as_tensor(sets[set_key])
        n_stacked = len(sets[set_key]) * n_win
        phi_s[row, :n_stacked], b_s[row, :n_stacked] = (
            phi[member_ranks].reshape(n_stacked, -1),
            b[member_ranks].reshape(n_stacked),
        )
        y_s[row, :n_stacked], prec_s[row, :n_stacked] = (
            y[member_ranks].reshape(n_stacked),
            prec[member_ranks].reshape(n_stacked),
        )
    first = torch.as_tensor([sets[k][0] for k in keys])
    m0_s, p0_s = m0[first], p0[first]
    loglik = []
    for hypothesis in HYPOTHESES:
        features = phi_s.clone()
        features[..., PADS] = pads(b_s, hypothesis, b_ref)
        best = None
        for resid_var in SCALES:
            prior_var = p0_s.clone()
            prior_var[:, PADS.stop :] = resid_var
            evidence = log_evidence(features, y_s, prec_s, pad_prior(m0_s, hypothesis), prior_var)
            best = evidence if best is None else torch.maximum(best, evidence)
        assert best is not None
        loglik.append(best)
    rank_loglik = torch.stack(loglik, dim=-1).numpy()[row_of]  # (N, H)
    # a tile needs the windows that still count at three sizes or more, a wave at four
    distinct = _distinct_sizes(b, prec, group, pooled)
    need = np.array([1 if h == (1, 1) else 3 if h[1] == 1 else 4 for h in HYPOTHESES])
    score = np.where(distinct[:, None] >= need[None, :], rank_loglik + LOG_PRIOR, -math.inf)
    score -= score.max(axis=1, keepdims=True)
    weights = np.exp(score)
    weights /= weights.sum(axis=1, keepdims=True)
    # each rank's mixture: its few most probable hypotheses (every prediction reads each
    # hypothesis in use, so the mixture's size is the planner's cost)
    kth = -np.sort(-weights, axis=1)[:, MAX_MIXTURE - 1 : MAX_MIXTURE]
    weights = np.where((weights >= kth) & (weights >= MIN_WEIGHT), weights, 0.0)
    return np.asarray(weights / weights.sum(axis=1, keepdims=True))
