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
    otherwise weigh without bound (as in every other loss here);
  * the mask is computed on the rows the loss sees. A step that the trainer splits into
    micro-batches gets one mask per micro-batch, not the paper's one per step (the second moment
    depends on the current policy, unknown before the forward pass); when a step fits one
    micro-batch, as the built-in models' do, the two are the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .base import DUAL_CLIP, LOG_RATIO_MAX, LossInputs, LossOutput, clipped_surrogate, frac, k3, seq_mean, weight_stats


@dataclass(frozen=True)
class M2POConfig:
    tau: float = 0.04
    """Bound on the mean squared log ratio of the kept candidate tokens (the paper's tau_M2)."""
    normalize_std: bool = True
    dual_clip: float = DUAL_CLIP


def m2po_mask(log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, tau: float) -> torch.Tensor:
    """[B, T] bool, True where a token stays: every real token except the candidates with the
    largest squared log ratio, dropped until the kept candidates' mean is <= tau. No gradient."""
    l = log_ratio.detach()
    a = adv[:, None].expand_as(l)
    cand = mask & (((a > 0) & (l > 0)) | ((a < 0) & (l < 0)))
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
    keep = m2po_mask(log_ratio, inp.advantages, inp.mask, cfg.tau)
    per_token, _ = clipped_surrogate(ratio, inp.advantages[:, None], math.inf, math.inf, cfg.dual_clip)
    whole_tokens = inp.whole.tokens if inp.whole is not None else int(inp.mask.sum())
    loss = torch.where(keep, per_token, 0.0).sum() / max(whole_tokens, 1)
    m = inp.mask
    return LossOutput(loss, {
        **weight_stats(ratio[m]),
        "clip_frac": frac(~keep[m]),  # tokens masked by the second-moment bound
        "kl_k3": seq_mean(k3(inp.old_logp.detach() - inp.logp).detach(), m).mean().item(),
    })
