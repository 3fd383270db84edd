"""M2PO (Zheng et al., arXiv 2510.01161): a second-moment trust region for stale rollouts.

With per-token log ratios l_{i,t} = l^p_{i,t} - l^q_{i,t} (q: the sampler's older weights, sg):

    candidates  C = {(i, t): A_i > 0 and l_{i,t} > 0, or A_i < 0 and l_{i,t} < 0}
                    (where PPO's clip would act)
    mask        drop the candidates with the largest l^2 until mean_{C kept} l^2 <= tau (0.04)
    L           = sum_{i,t} -M_{i,t} r_{i,t} A_i / (number of real tokens),  r = exp(l)

No clip: the trust region is on the batch's second moment, so informative high-entropy tokens
are kept and only the extreme outliers go. Two choices of ours, stated:
  * the dual clip (base.clipped_surrogate with infinite eps) caps the loss of A < 0 tokens at
    c |A|: an A < 0 token with r >> 1 is not a candidate, and a forged behaviour log-prob would
    otherwise weigh without bound (as in every other loss here). The authors' released code
    (Infini-AI-Lab/M2PO, verl) has no dual clip; `dual_clip = inf` runs it that way;
  * the mask is computed on the rows the loss sees: one mask per micro-batch, as in the released
    code (which computes it per micro-batch per GPU).
The released code also differs from the paper's Algorithm 1 (`bound = "drop"`, the default) in
how it enforces the bound (`bound = "cap"`): it caps the candidates' squared log ratios at the c
for which sum_C min(l^2, c) = tau |C| and PPO-clips every token to [exp(-sqrt c), exp(sqrt c)].
Dropping keeps every candidate but the largest, however far the kept ones moved, as long as the
many small ones pull the mean under tau; capping clips every candidate past sqrt(c), which is
about sqrt(tau) = 0.2 once many tokens have moved: a PPO clip whose width the batch sets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from node.algorithms.base import DUAL_CLIP, LOG_RATIO_MAX, LossInputs, LossOutput, clipped_surrogate, frac, k3, seq_mean, token_rollout, weight_stats


@dataclass(frozen=True)
class M2POConfig:
    tau: float = 0.04
    """Bound on the mean squared log ratio of the kept candidate tokens (the paper's tau_M2)."""
    normalize_std: bool = True
    dual_clip: float = DUAL_CLIP
    dual_truncate: bool = False
    """Past c, keep pushing at the capped weight c (base.clipped_surrogate's `truncate`) rather
    than no gradient: the same bound on a forged claim's influence."""
    bound: str = "drop"
    """"drop": the paper's Algorithm 1 (mask the largest); "cap": the released code's (clip at sqrt c)."""

    def __post_init__(self) -> None:
        if self.bound not in ("drop", "cap"):
            raise ValueError(f"m2po: bound must be 'drop' or 'cap', not {self.bound!r}")


def candidates(log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] bool: the tokens PPO's clip would act on (A > 0 and l > 0, or A < 0 and l < 0)."""
    a = adv[:, None].expand_as(log_ratio)
    return mask & (((a > 0) & (log_ratio > 0)) | ((a < 0) & (log_ratio < 0)))


def m2po_cap(sq: torch.Tensor, tau: float) -> float:
    """sqrt(c) for the c with sum_i min(sq_i, c) = tau * len(sq); inf when mean(sq) <= tau already.

    sum_i min(sq_i, c) grows piecewise linearly in c; with sq sorted ascending, the first k whose
    f(k) = sum_i min(sq_i, sq_k) reaches the target has c between sq_{k-1} and sq_k, where
    sum_{i<k} sq_i + (n - k) c = target. (The released code returns sqrt(sq_{k-1}), the breakpoint
    below: a slightly tighter cap.)"""
    n = sq.numel()
    target = tau * n
    if n == 0 or float(sq.sum()) <= target:
        return math.inf
    v, _ = torch.sort(sq.detach().double())
    csum = v.cumsum(0)
    rest = torch.arange(n - 1, -1, -1, device=v.device, dtype=v.dtype)  # n - k - 1
    k = int(((csum + v * rest) >= target).nonzero()[0])
    below = float(csum[k - 1]) if k else 0.0
    return math.sqrt((target - below) / (n - k))


def m2po_mask(log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """[B, T] bool, True where a token stays: every real token except the candidates with the
    largest squared log ratio, dropped until the kept candidates' mean is <= tau. No gradient."""
    l = log_ratio.detach()
    cand = candidates(l, adv, mask)
    keep = mask.clone()
    sq = l[cand].square()
    if sq.numel() and sq.mean() > tau:
        values, order = torch.sort(sq)  # ascending: keep the longest prefix whose mean is <= tau
        prefix_means = values.cumsum(0) / torch.arange(1, len(values) + 1, device=values.device, dtype=values.dtype)
        kept = int((prefix_means <= tau).sum())
        drop = cand.nonzero()[order[kept:]]
        keep[drop[:, 0], drop[:, 1]] = False
    return keep


def m2po_loss(inp: LossInputs, cfg: M2POConfig) -> LossOutput:
    log_ratio = (inp.logp - inp.old_logp.detach()).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
    ratio = torch.exp(log_ratio)
    m = inp.mask
    if cfg.bound == "drop":
        keep = m2po_mask(log_ratio, inp.advantages, m, cfg.tau)
        per_token, _ = clipped_surrogate(ratio, inp.advantages[:, None], math.inf, math.inf, cfg.dual_clip,
                                         cfg.dual_truncate)
        bounded = ~keep
    else:
        l = log_ratio.detach()
        cap = m2po_cap(l[candidates(l, inp.advantages, m)].square(), cfg.tau)
        eps_low, eps_high = (math.inf, math.inf) if math.isinf(cap) else (1 - math.exp(-cap), math.expm1(cap))
        per_token, bounded = clipped_surrogate(ratio, inp.advantages[:, None], eps_low, eps_high, cfg.dual_clip, cfg.dual_truncate)
        keep = m
    per_token = token_rollout(per_token, inp)
    whole_tokens = inp.whole.tokens if inp.whole is not None else int(m.sum())
    loss = torch.where(keep, per_token, 0.0).sum() / max(whole_tokens, 1)  # keep is within m
    return LossOutput(loss, {
        **weight_stats(ratio[m]),
        "clip_frac": frac(bounded[m]),  # drop: tokens masked; cap: tokens clipped, by the bound or the dual clip
        "kl_k3": seq_mean(k3(inp.old_logp.detach() - inp.logp).detach(), m).mean().item(),
    })
