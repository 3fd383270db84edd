"""GSPO (Zheng et al. 2025, Group Sequence Policy Optimization): one ratio per sequence.

    s_i = exp( mean_t (l^p_{i,t} - l^q_{i,t}) )
    L = mean_i -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), dual-clipped at c|A_i| for A_i < 0

with the paper's tiny clip range eps_low = 3e-4, eps_high = 4e-4 by default: under staleness most
sequences are clipped, which is why GSPO's last score can fall far below its best.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from node.algorithms.base import DUAL_CLIP, batch_mean, LOG_RATIO_MAX, LossInputs, LossOutput, clipped_surrogate, frac, k3, seq_mean, seq_rollout, weight_stats


@dataclass(frozen=True)
class GSPOConfig:
    eps_low: float = 3e-4
    eps_high: float = 4e-4
    normalize_std: bool = True
    dual_clip: float = DUAL_CLIP
    """Cap c on the loss of negative-advantage elements (base.clipped_surrogate)."""
    dual_truncate: bool = False
    """Past c, keep pushing at the capped weight c (base.clipped_surrogate's `truncate`) rather
    than no gradient: the same bound on a forged claim's influence."""


def gspo_loss(inp: LossInputs, cfg: GSPOConfig) -> LossOutput:
    log_s = seq_mean(inp.logp - inp.old_logp.detach(), inp.mask).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
    s = torch.exp(log_s)  # [B]
    per_seq, clipped = clipped_surrogate(s, inp.advantages, cfg.eps_low, cfg.eps_high, cfg.dual_clip, cfg.dual_truncate)
    return LossOutput(batch_mean(seq_rollout(per_seq, inp), inp.whole), {
        **weight_stats(s),
        "clip_frac": frac(clipped),
        "kl_k3": seq_mean(k3(inp.old_logp.detach() - inp.logp).detach(), inp.mask).mean().item(),
    })
