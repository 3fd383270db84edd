"""Truncated importance sampling without a clip (TIS / CISPO-style): REINFORCE on stale rollouts with
a truncated, stop-gradient importance weight on every token.

    w_{i,t} = sg( min(exp(l^p_{i,t} - l^q_{i,t}), c) )                   c = `cap`, 2 by default
    R_{i,t} = exp(l^p_{i,t} - sg(l^p_{i,t}))                             = 1, gradient of l^p
    L       = agg_{i,t} -w_{i,t} R_{i,t} A_i,    grad L = agg_{i,t} -w_{i,t} A_i grad l^p_{i,t}

the gradient of MiniMax-M1's CISPO (arXiv 2506.13585: J = E[sg(clip(r, 1 - eps_low, 1 + eps_high))
A log p], its lower bound in practice off, so c = 1 + eps_high) and of TIS (Yao et al. 2025, "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training": min(r, C) on the sampler/learner
gap, C = 2 in its runs; ms-swift's `rollout_importance_sampling_threshold` defaults to 2). R in place
of log p gives the same gradient with the loss value -w A, on the scale of the other losses'.
Unlike GRPO's clip, no token ever loses its gradient: one whose ratio ran past c keeps pushing at
weight c, so every token's gradient weight is at most c |A| for either sign of A, whatever a sampler
claims (the dual clip's truncated form, base.clipped_surrogate, without the PPO clip around 1).
On-policy every w is 1 (for c >= 1) and the gradient is the unclipped policy gradient, `pg`'s.

c = 2: TIS's and this project's other truncations' (F-TIS, `behaviour.rollout_is_cap`), so the
three weigh a token alike; a ratio of 2 is 0.69 nats, about 4x GRPO's clip (0.18).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from node.algorithms.base import LOG_RATIO_MAX, LossInputs, LossOutput, aggregate, frac, k3, seq_mean, token_rollout, weight_stats


@dataclass(frozen=True)
class TISConfig:
    cap: float = 2.0
    """c: the largest weight a token gets (w = min(p/q, c)); in [1, inf)."""
    aggregation: str = "seq_mean"
    dr_grpo_max_tokens: int | None = None
    normalize_std: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.cap < math.inf:
            raise ValueError(f"tis: cap must be in [1, inf), not {self.cap} (below 1 on-policy tokens weigh less than "
                             "their gradient; infinite, a forged claim sets a token's weight)")


def tis_loss(inp: LossInputs, cfg: TISConfig) -> LossOutput:
    log_ratio = (inp.logp.detach() - inp.old_logp.detach()).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)  # [B, T]
    truncated = log_ratio > math.log(cfg.cap)
    w = torch.exp(log_ratio.clamp(max=math.log(cfg.cap)))  # sg(min(p/q, c))
    r = torch.exp(inp.logp - inp.logp.detach())  # value 1, gradient d l^p
    per_token = token_rollout(-w * r * inp.advantages[:, None], inp)
    loss = aggregate(per_token, inp.mask, cfg.aggregation, inp.whole, cfg.dr_grpo_max_tokens)
    m = inp.mask
    return LossOutput(loss, {
        **weight_stats(torch.exp(log_ratio)[m]),  # the ratios before truncation, as GRPO's before its clip
        "clip_frac": frac(truncated[m]),  # where the bound acted (M2PO's bound is counted so too)
        "truncated_frac": frac(truncated[m]),
        "kl_k3": seq_mean(k3(inp.old_logp.detach() - inp.logp).detach(), m).mean().item(),
    })
