"""Top-k and top-p at the edge of the kept set, as any engine within a tolerance could have applied
them: the audit's side of checkable sampling's filters (node/sampling/race.race_margins).

A sampler's engine keeps a token by its own logits; the auditor's differ by the engines' error. A
token the sampler kept by a hair can fall outside the auditor's set, and one the auditor keeps by a
hair may never have raced for the sampler. `admitted` answers, per token, whether every engine
within h of the auditor's tempered logits keeps it and whether some engine does, looking only at
the tokens near the edge where it can (`_top_p_band`, the band near the k-th logit) and giving the
whole row's answer exactly (tests/unit/node/test_race.py).
"""

from __future__ import annotations

import math

import torch


def admitted(x: torch.Tensor, h: float, top_k: int = 0, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Which tokens pass top-k then top-p for an engine whose tempered logits differ from `x`
    ([N, V], float64, unfiltered) by at most `h` each: (those that every such engine keeps, those
    that some such engine keeps), bool [N, V] each. h = 0 gives the filters of `tempered` in both
    (up to ties).

    With top-k, only the tokens within 2h of the k-th logit (kth) take part (`_admitted` on the
    row's top ones, those and maybe a few more): a token more than 2h below kth has k tokens
    surely above it, so no such engine keeps it. Every count the others need is of tokens in the
    band: a token at or above kth that every engine keeps has all that may sit above it within
    2h of it; one below kth is kept by no engine in the worst case (k tokens above it) and, in
    the best case, only those surely above it count, all at or above kth. At a 151k vocabulary
    and top-k 20 that is a few dozen tokens per row, not a sort of the whole row (which took 6x
    the exact filters' time on a CPU). The masks are the whole-row computation's exactly where
    cumsum is sequential (the CPU); a GPU's parallel scan may round the band's prefix sums in
    the last bit otherwise, which moves a top-p decision only at an exact knife edge."""
    v = x.shape[-1]
    put = lambda index, m: torch.zeros_like(x, dtype=torch.bool).scatter_(-1, index, m)  # noqa: E731
    if top_k and top_k < v:
        kth = x.topk(top_k, dim=-1).values[:, -1:]
        width = int((x >= kth - 2 * h).sum(-1).max())  # the auditor's sync, once per block of rows
        if width < v:
            values, index = x.topk(width, dim=-1)
            surely, possibly = _admitted(values, h, top_k, top_p)
            return put(index, surely), put(index, possibly)
    elif top_p < 1.0 and (band := _top_p_band(x, h, top_p)) is not None:
        values, index, tail, edge = band
        surely, possibly = _admitted(values, h, 0, top_p, tail)
        out = values >= edge  # the lower strip's tokens are kept by no engine (`_top_p_band`)
        return put(index, surely & out), put(index, possibly & out)
    return _admitted(x, h, top_k, top_p)


TOP_P_WIDTH = 64
"""The tokens `_top_p_band` first looks at per row, widened 4x at a time while the nucleus is wider."""


def _top_p_band(x: torch.Tensor, h: float, top_p: float):
    """Top-p alone: (values, index) of the row's tokens within 4h below `edge`, the mass of the
    rest (relative to the row's largest, as `_admitted` weighs), and `edge` - 2h ([N, 1]), below
    which no engine within h keeps a token; None where the band would be most of the row.

    Why: a token k is kept by some engine only if the tokens surely above it (x_j > x_k + 2h),
    lowered by e^-h, weigh less than top_p of themselves plus the rest raised by e^h. With A the
    mass surely above and `full` the row's, the rest is at most full - A, so no engine keeps k once
    A >= need = top_p e^h full / ((1 - top_p) e^-h + top_p e^h). The m largest tokens whose mass
    first reaches `need` are all surely above every token below edge - 2h (edge: the m-th largest
    logit), so those are out; the tokens that may sit above a token at or over edge - 2h are all
    within 4h of edge, so `_admitted` on that band, told the mass below it, decides those exactly.
    At a 151k vocabulary and T 0.6 a nucleus is tens to hundreds of tokens, not a sort of the row."""
    v = x.shape[-1]
    top = x.max(-1, keepdim=True).values
    full = (x - top).exp().sum(-1, keepdim=True)
    need = full * (top_p / ((1 - top_p) * math.exp(-2 * h) + top_p)) * (1 + 1e-9)  # e^h over and under: no overflow
    width = TOP_P_WIDTH
    while True:
        if 4 * width >= v:
            return None
        largest = x.topk(width, dim=-1).values
        mass = (largest - top).exp().cumsum(-1)
        if bool((mass[:, -1:] >= need).all()):  # the auditor's sync
            break
        width *= 4
    m = (mass < need).sum(-1, keepdim=True)  # the first count of largest tokens whose mass reaches need, less 1
    edge = largest.gather(-1, m)
    band = int((x >= edge - 4 * h).sum(-1).max())
    if 2 * band >= v:
        return None
    values, index = x.topk(band, dim=-1)
    tail = (full - (values - top).exp().sum(-1, keepdim=True)).clamp(min=0)
    return values, index, tail, edge - 2 * h


def _admitted(x: torch.Tensor, h: float, top_k: int = 0, top_p: float = 1.0,
              tail: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`admitted` over every token of x's rows, from one sort; `tail` [N, 1]: the mass of tokens
    of the row left out of x, all below every token whose decision counts (`_top_p_band`).

    Token k's worst (best) case: every token that may sit above it (x_j > x_k - 2h; best case:
    those that must, x_j > x_k + 2h) raised by h (lowered), k and the tokens below it lowered
    (raised); top-k counts the tokens above, top-p compares their share of the kept set's mass with
    `top_p`. The kept set that top-p normalises over is, per token, the set top-k keeps in the same
    case, a prefix of the sorted logits."""
    v = x.shape[-1]
    sx = x.sort(-1, descending=True).values
    top = sx[:, :1]
    ascending = sx.flip(-1).contiguous()
    w = (x - top).exp()  # each token's weight, relative to the row's largest
    prefix = torch.cat([torch.zeros_like(top), (sx - top).exp().cumsum(-1)], -1)  # prefix[:, c]: the c largest
    out = []
    for sign in (-1.0, 1.0):  # every engine (worst case), some engine (best case)
        t = x + sign * 2 * h  # token j may sit above token k when x_j > t_k
        above = v - torch.searchsorted(ascending, t, right=True)  # tokens with x_j > t_k, k included if t_k < x_k
        self_in = t < x
        keep = torch.ones_like(x, dtype=torch.bool)
        if top_k and top_k < v:
            keep &= above - self_in.long() < top_k
            # the set top-k keeps in this case: the tokens with fewer than top_k above them, a prefix
            total = prefix.gather(-1, keep.sum(-1, keepdim=True))
        else:
            total = prefix[:, -1:] if tail is None else prefix[:, -1:] + tail
        if top_p < 1.0:
            mass_above = prefix.gather(-1, above) - torch.where(self_in, w, 0.0)
            rest = (total - torch.where(keep, w, 0.0) - mass_above).clamp(min=0)  # the kept set below k
            # what the tokens above k weigh in this case, e^-sh x mass_above, against top_p of the kept
            # set's, both over e^-sh: e^2sh capped (a wide slack overflowed it; beyond, the answer
            # no longer changes)
            grow = math.exp(min(2 * sign * h, 700.0))
            keep &= mass_above < top_p * (mass_above + grow * (rest + w))
        out.append(keep)
    return out[0], out[1]
