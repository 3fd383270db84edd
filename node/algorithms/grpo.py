"""GRPO (Shao et al. 2024, DeepSeekMath), token-level PPO clip on group-relative advantages.

    rho_{i,t} = exp(l^p_{i,t} - l^q_{i,t})
    L = agg_{i,t} -min(rho_{i,t} A_i, clip(rho_{i,t}, 1 - eps_low, 1 + eps_high) A_i), dual-clipped at c|A_i| for A_i < 0
        [+ beta k3(min(l^q - l^p, log c)) per token: the GEPO authors' baseline's KL to the sampler]

`agg` is the paper's mean over a sequence's tokens then over sequences (`seq_mean`), or DAPO's
`token_mean`, or Dr. GRPO's constant-normaliser `dr_grpo` (base.aggregate). As the
stale-sample loss, q is the sampler's older weights, so rho corrects per token, unboundedly
before the clip: the variance GEPO's paper measures grows with staleness.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from node.algorithms.base import (DUAL_CLIP, LOG_RATIO_MAX, LossInputs, LossOutput, aggregate, clipped_surrogate, frac, k3, k3_bounded,
                   seq_mean, token_rollout, weight_stats)


@dataclass(frozen=True)
class GRPOConfig:
    eps_low: float = 0.2
    eps_high: float = 0.2
    aggregation: str = "seq_mean"
    dr_grpo_max_tokens: int | None = None
    """Dr. GRPO's constant; None uses the step's longest completion (base.BatchShape)."""
    normalize_std: bool = True
    dual_clip: float = DUAL_CLIP
    """Cap c on the loss of negative-advantage elements (base.clipped_surrogate)."""
    dual_truncate: bool = False
    """Past c, keep pushing at the capped weight c (base.clipped_surrogate's `truncate`) rather
    than no gradient: the same bound on a forged claim's influence."""
    beta: float = 0.0
    """Weight of a per-token k3 KL to the sampler's policy (its log(q/p) capped at log c, as GEPO's):
    the GEPO authors' GRPO baseline runs 0.005 (examples/paper_delay's `grpo-paper`)."""

    def __post_init__(self) -> None:
        if self.beta < 0 or not self.dual_clip > 1:
            raise ValueError("grpo: need beta >= 0 and dual_clip > 1")


@dataclass(frozen=True)
class DrGRPOConfig(GRPOConfig):
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): GRPO without the
    length normalisation (constant normaliser) and without the std normalisation of advantages."""

    aggregation: str = "dr_grpo"
    normalize_std: bool = False


def grpo_terms(inp: LossInputs, cfg: GRPOConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GRPO's per-token loss before aggregation [B, T] (rollout-weighted, KL added), which tokens
    the clip or dual clip bit [B, T] bool, and the ratios rho [B, T] (for the diagnostics)."""
    # q is data (the sampler's claim): sg(l^q), so no gradient can reach it even if it carries one
    log_ratio = (inp.logp - inp.old_logp.detach()).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
    ratio = torch.exp(log_ratio)  # [B, T]
    per_token, clipped = clipped_surrogate(ratio, inp.advantages[:, None], cfg.eps_low, cfg.eps_high, cfg.dual_clip,
                                           cfg.dual_truncate)
    per_token = token_rollout(per_token, inp)
    if cfg.beta:  # gradient through l^p only; capped so a claimed q cannot make it unbounded
        per_token = per_token + cfg.beta * k3_bounded(inp.old_logp.detach() - inp.logp, cfg.dual_clip)
    return per_token, clipped, ratio


def grpo_metrics(inp: LossInputs, clipped: torch.Tensor, ratio: torch.Tensor) -> dict[str, float]:
    """GRPO's diagnostics over the real tokens: the ratios' mean and variance, the clipped share, k3."""
    m = inp.mask
    return {
        **weight_stats(ratio[m]),
        "clip_frac": frac(clipped[m]),
        "kl_k3": seq_mean(k3(inp.old_logp.detach() - inp.logp).detach(), m).mean().item(),
    }


def grpo_loss(inp: LossInputs, cfg: GRPOConfig) -> LossOutput:
    per_token, clipped, ratio = grpo_terms(inp, cfg)
    loss = aggregate(per_token, inp.mask, cfg.aggregation, inp.whole, cfg.dr_grpo_max_tokens)
    return LossOutput(loss, grpo_metrics(inp, clipped, ratio))
