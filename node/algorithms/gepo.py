"""GEPO (HeteroRL, arXiv 2508.17850): group-expectation importance weights for stale rollouts.

With length-normalised sequence probabilities p_i = exp(mean_t l^p_{i,t}) (learner, with grad)
and q_i = exp(mean_t l^q_{i,t}) (behaviour, stop-gradient), over the group of completions of the
same prompt:

    E_hat = sum_j q_j^2 / sum_j q_j          (self-normalised estimate of E_q[q])
    w_i   = p_i / E_hat
    L     = mean_i -min(w_i A_i, clip(w_i, 1 - eps, 1 + eps) A_i)
            + beta * mean_i mean_t k3(min(l^q - l^p, log c))               (optional k3 KL)

with PPO's min dual-clipped for A_i < 0 (base.clipped_surrogate), so every weight is bounded.

Replacing the per-sample q_i by a group constant is what cuts the weight variance once KL(p||q)
is large (the paper's Theorem 1, checked in tests/unit/node/test_algorithms.py). The group is the prompt's,
as the paper defines it; the authors' released code (HanlardResearch/Hetero-RL, `_compute_loss`)
takes E_hat over a shuffled micro-batch of 8 rows instead, keeps zero-variance groups, and caps
neither the loss of A < 0 nor its KL: `e_hat_rows = 8, keep_zero_variance = true, dual_clip =
inf, beta = 0.005` runs it that way (examples/paper_delay's `gepo-released`). Done in log space:
log E_hat = logsumexp(2 l_q) - logsumexp(l_q), so tiny q_i do not underflow to 0/0.

`decoupled = true` (examples/paper_delay's `gepo-decoupled`, ours, from the mechanism in
docs/RESULTS.md) keeps GEPO's weight and drops its clip:

    L = mean_i -sg(min(w_i, c)) A_i R_i,     R_i = exp(m_i - sg(m_i)),  m_i = mean_t l^p_{i,t}

the weight is a truncated stop-gradient coefficient (IMPALA's rho-bar, AReaL's decoupled PPO with
one update per batch: the trust region is centred on the learner's current policy, which one
step cannot leave). The clip on a length-normalised ratio stops a sequence only after its tokens
moved ~0.18 nats each on average, and then stops its gradient entirely; here a sequence the
policy moved away from weighs less as p_i falls, and never more than c |A|.
Measured: it collapsed under a lag of 32 (docs/RESULTS.md, section 6): with no clip relative to
q nothing stops the learner pushing a stale sequence further the way it has already moved.

`len_clip = true` (`gepo-lenclip`, ours, the other way out of the same mechanism) keeps the clip
and makes it bound each sequence's drift from its sampler, whatever its length:

    g_i = q_i / E_hat (sg; w_i = g_i on-policy)        delta_i = log(1 + eps) / sqrt(n_i)
    L   = mean_i -min(w_i A_i, clip(w_i, g_i e^-delta_i, min(g_i e^delta_i, c)) A_i), dual-clipped

GEPO's clip [1 - eps, 1 + eps] sits around 1, not where w sits on-policy (g_i), and bounds the
*mean* per-token log ratio, so a sequence of n tokens may move ~0.18 n nats (11 at 60 tokens) before
it bites. Centred on g_i and narrowed by sqrt(n_i), it lets log(1 + eps) sqrt(n_i) nats through
(1.4 at 60 tokens): per-token noise of the same size passes as under GRPO's token clip, a drift of
the whole sequence does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from node.algorithms.base import (DUAL_CLIP, LOG_RATIO_MAX, LossInputs, LossOutput, batch_mean, clipped_surrogate, frac, group_log_e_hat,
                   k3, k3_bounded, seq_mean, seq_rollout, weight_stats)


@dataclass(frozen=True)
class GEPOConfig:
    eps: float = 0.2
    beta: float = 0.0
    """Weight of the k3 KL to the sampler's policy; the paper uses 0.005."""
    normalize_std: bool = False
    dual_clip: float = DUAL_CLIP
    """Cap c on the loss of negative-advantage sequences (base.clipped_surrogate) and on the KL's
    ratio; inf: neither capped (the released code's)."""
    dual_truncate: bool = False
    """Past c, keep pushing at the capped weight c (base.clipped_surrogate's `truncate`) rather
    than no gradient: the same bound on a forged claim's influence."""
    e_hat_rows: int = 0
    """0: E_hat over the prompt's group (the paper's definition); N: over the step's rows shuffled
    into blocks of N, prompts mixed (the released code's micro-batches: 8)."""
    decoupled: bool = False
    """The weight as a truncated coefficient min(w, c) on the policy gradient, no clip (above)."""
    len_clip: bool = False
    """The clip centred on the sampler's group factor and narrowed by sqrt(length) (above)."""
    keep_zero_variance: bool = False
    """Train on groups whose rewards are all equal too (advantage 0): they count in the batch mean
    and in E_hat, as in the released code; False skips and counts them, as every other loss does."""

    def __post_init__(self) -> None:
        if self.e_hat_rows < 0 or not self.eps > 0 or not self.dual_clip > 1 or self.beta < 0:
            raise ValueError("gepo: need e_hat_rows >= 0, eps > 0, dual_clip > 1, beta >= 0")
        if self.decoupled and self.len_clip:
            raise ValueError("gepo: decoupled drops the clip that len_clip reshapes; choose one")


@dataclass(frozen=True)
class GEPOLenClipConfig(GEPOConfig):
    """`gepo_lenclip`, the learner's default for its own model's rollouts: GEPO with `len_clip`.
    A name of its own rather than `gepo` with a default option, so a config that names another loss
    never inherits a GEPO-only field. The default by docs/RESULTS.md's protocol ("At a glance"):
    above GRPO under a pinned lag of 32 and 128 versions, non-inferior on-policy and in the demo."""

    len_clip: bool = True


def gepo_log_weights(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor,
                     log_e_hat: torch.Tensor | None = None) -> torch.Tensor:
    """log w_i = mean_t l^p_{i,t} - log E_hat(group of i); [B, T] x 2 -> [B], grad through l^p only.

    `log_e_hat` [B]: the groups' E_hat from the whole batch when these rows are a micro-batch
    that may hold part of a group (node/training/step.py); computed from these rows otherwise."""
    if log_e_hat is None:
        log_e_hat = group_log_e_hat(old_logp, mask, group_ids)
    return seq_mean(logp, mask) - log_e_hat


def gepo_loss(inp: LossInputs, cfg: GEPOConfig) -> LossOutput:
    log_e_hat = inp.log_e_hat if inp.log_e_hat is not None else group_log_e_hat(inp.old_logp, inp.mask, inp.group_ids)
    log_w = gepo_log_weights(inp.logp, inp.old_logp, inp.mask, inp.group_ids, log_e_hat)
    w = torch.exp(log_w.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX))  # [B]
    if cfg.decoupled:
        coef = w.detach().clamp(max=cfg.dual_clip)
        m = seq_mean(inp.logp, inp.mask)
        per_seq, clipped = -coef * inp.advantages * torch.exp(m - m.detach()), w > cfg.dual_clip
    elif cfg.len_clip:
        log_g = (seq_mean(inp.old_logp, inp.mask) - log_e_hat).detach()  # log(q_i / E_hat): log w_i on-policy
        delta = math.log(1 + cfg.eps) / inp.mask.sum(-1).clamp(min=1).sqrt()
        lo, hi = torch.exp(log_g - delta), torch.exp(log_g + delta).clamp(max=cfg.dual_clip)
        per_seq, clipped = clipped_surrogate(w, inp.advantages, 1 - lo, hi - 1, cfg.dual_clip, cfg.dual_truncate)
    else:
        per_seq, clipped = clipped_surrogate(w, inp.advantages, cfg.eps, cfg.eps, cfg.dual_clip, cfg.dual_truncate)
    per_seq = seq_rollout(per_seq, inp)
    if cfg.beta:  # the KL term: log(q/p) capped at log c, so its gradient stays bounded; grad via l^p
        per_seq = per_seq + cfg.beta * seq_mean(k3_bounded(inp.old_logp.detach() - inp.logp, cfg.dual_clip), inp.mask)
    loss = batch_mean(per_seq, inp.whole)
    return LossOutput(loss, {
        **weight_stats(w),
        "clip_frac": frac(clipped),
        # the diagnostic is the unbounded k3, as every other loss logs it (the loss term's is capped)
        "kl_k3": seq_mean(k3(inp.old_logp.detach() - inp.logp).detach(), inp.mask).mean().item(),
    })
