"""F-TIS (arXiv 2605.22537): filtered, truncated importance sampling for rollouts of another model g.

Per token, with the learner p and the foreign generator g:

    w_{i,t} = sg( min(exp(l^p_{i,t} - l^g_{i,t}), C) )                    truncation, C = 2
    R_{i,t} = exp(l^p_{i,t} - sg(l^p_{i,t}))                               = 1, gradient of l^p
    L       = agg_{i,t} -w_{i,t} min(R A'_i, clip(R, 1 - eps, 1 + eps) A'_i)

Filter: A'_i = 0 where A_i <= 0 and the sequence's mean k3 KL between g and p,
mean_t [exp(l^g - l^p) - (l^g - l^p) - 1], exceeds `kl_threshold` (default 20, calibrated in
docs/RESULTS.md: >= 90% of the failures of models that do not do the task exceed it): a far-off
foreign failure says little about p and would push p around hard. Advantages are computed over
the foreign group before filtering (the caller does that).

Beyond the paper (which needs a shared vocabulary): when the generator's tokenizer differs, the
learner re-tokenizes the text and passes `old_seq_logp`, g's log-probability of the whole
completion (the sum over its own tokens, EOS included only where g stopped). Per-token ratios do
not exist then, but the probabilities of the same text do, whatever the tokenizations, so

    d_i = (sum_t l^p_{i,t} - log g(y_i)) / n_i         n_i = the learner's tokens of y_i

the log of the per-token geometric-mean ratio, stands in for every token's log p/g in the cap,
and the gate is k3(-d_i). By Jensen k3(-d_i) <= mean_t k3(-d_{i,t}): the sequence-level gate can
only see the average gap, never gaps that cancel (+5 and -5 give 73 at token level, 0 here), so
it is a looser filter than the paper's, of far-off text only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from node.algorithms.base import LOG_RATIO_MAX, LossInputs, LossOutput, aggregate, clipped_surrogate, frac, k3, seq_mean, token_rollout, weight_stats


@dataclass(frozen=True)
class FTISConfig:
    cap: float = 2.0
    eps: float = 0.2
    kl_threshold: float = 20.0
    """Measured on the tiny models (docs/RESULTS.md); its scale grows with the vocabulary: measure it
    for your models (examples/paper_hetero/run.py, `gate_values`)."""
    aggregation: str = "seq_mean"
    dr_grpo_max_tokens: int | None = None
    normalize_std: bool = True


def ftis_weights(inp: LossInputs, cap: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w [B, T] detached, truncated [B, T] bool, seq_kl [B]) at token or sequence level."""
    logp = inp.logp.detach()
    if inp.old_seq_logp is None:
        d = (logp - inp.old_logp).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)  # [B, T] log p/g
        seq_kl = seq_mean(k3(-d), inp.mask)  # the mean over tokens, as the paper's gate (not the max)
    else:
        n = inp.mask.sum(-1).clamp(min=1)
        d_seq = (torch.where(inp.mask, logp, 0.0).sum(-1) - inp.old_seq_logp) / n
        d_seq = d_seq.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
        seq_kl = k3(-d_seq)
        d = d_seq[:, None].expand_as(logp)
    truncated = d > math.log(cap)
    return torch.exp(d.clamp(max=math.log(cap))), truncated, seq_kl


def ftis_loss(inp: LossInputs, cfg: FTISConfig) -> LossOutput:
    w, truncated, seq_kl = ftis_weights(inp, cfg.cap)
    filtered = (inp.advantages <= 0) & (seq_kl > cfg.kl_threshold)  # [B]
    adv = torch.where(filtered, torch.zeros_like(inp.advantages), inp.advantages)
    ratio = torch.exp(inp.logp - inp.logp.detach())  # value 1, gradient d l^p
    per_token, clipped = clipped_surrogate(ratio, adv[:, None], cfg.eps, cfg.eps)
    loss = aggregate(token_rollout(w * per_token, inp), inp.mask, cfg.aggregation, inp.whole, cfg.dr_grpo_max_tokens)
    m = inp.mask
    return LossOutput(loss, {
        **weight_stats(w[m]),
        "clip_frac": frac(clipped[m]),
        "kl_k3": seq_kl.mean().item(),
        "filtered_frac": frac(filtered),
        "truncated_frac": frac(truncated[m]),
    })
