"""Typed loss inputs/outputs and the small pieces every policy loss shares.

Shapes: B sequences (completions), T completion positions (padded). `mask` [B, T] marks real
completion tokens; `group_ids` [B] says which completions answer the same prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

LOG_RATIO_MAX = 20.0
"""Log importance ratios are clamped to +-20 (e^20 ~ 5e8) before exp: beyond that a ratio is
already clipped or truncated by every loss here, and the clamp keeps exp() and its gradient
finite for extreme log-prob gaps (a -1e4 log-prob from a foreign model is real input)."""


@dataclass
class LossInputs:
    logp: torch.Tensor
    """[B, T] learner token log-probs (logits / T), carrying the gradient."""
    old_logp: torch.Tensor
    """[B, T] behaviour token log-probs: q (this model, older version) or g (another model)."""
    advantages: torch.Tensor
    """[B] one advantage per completion (node.algorithms.advantages)."""
    mask: torch.Tensor
    """[B, T] bool, True on completion tokens."""
    group_ids: torch.Tensor
    """[B] int, completions of the same prompt share an id; groups may differ in size."""
    old_seq_logp_mean: torch.Tensor | None = None
    """[B] optional: behaviour mean token log-prob on the *behaviour model's own* tokenization,
    for foreign rollouts whose tokenizer differs (F-TIS then works at sequence level)."""

    def __post_init__(self) -> None:
        B, T = self.logp.shape
        if self.old_logp.shape != (B, T) or self.mask.shape != (B, T):
            raise ValueError(f"logp {tuple(self.logp.shape)}, old_logp {tuple(self.old_logp.shape)} "
                             f"and mask {tuple(self.mask.shape)} must all be [B, T]")
        if self.advantages.shape != (B,) or self.group_ids.shape != (B,):
            raise ValueError("advantages and group_ids must be [B]")
        self.mask = self.mask.bool()


@dataclass
class LossOutput:
    loss: torch.Tensor
    """Scalar to minimise."""
    metrics: dict[str, float] = field(default_factory=dict)
    """is_weight_mean, is_weight_var, clip_frac, kl_k3 (+ filtered_frac, truncated_frac for F-TIS)."""


def seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each row's masked tokens: [B, T] -> [B]; 0 for an empty row."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 KL estimator exp(d) - d - 1 of d = log(a/b) (Schulman): >= 0, unbiased, low variance."""
    d = log_ratio.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
    return torch.exp(d) - d - 1


def group_logsumexp(x: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """logsumexp of x over each element's group, returned per element: [B] -> [B]."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1
    gmax = torch.full((n,), -torch.inf, dtype=x.dtype).scatter_reduce(0, inv, x, "amax")
    sums = torch.zeros(n, dtype=x.dtype).index_add(0, inv, torch.exp(x - gmax[inv]))
    return (torch.log(sums) + gmax)[inv]


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float):
    """PPO's -min(r A, clip(r, 1-eps_low, 1+eps_high) A) and where the clipped branch bites."""
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    return -torch.minimum(unclipped, clipped), clipped < unclipped


AGGREGATIONS = ("seq_mean", "token_mean", "dr_grpo")


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str, max_tokens: int | None = None) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    seq_mean   (GRPO): mean over a sequence's tokens, then over sequences.
    token_mean (DAPO): sum over all tokens / number of tokens.
    dr_grpo    (Dr. GRPO, Liu et al. 2025): sum over all tokens / (B * max_tokens), a constant,
               so long wrong answers are not favoured by length normalisation.
    """
    if how == "seq_mean":
        return seq_mean(per_token, mask).mean()
    if how == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if how == "dr_grpo":
        return (per_token * mask).sum() / (mask.shape[0] * (max_tokens or mask.shape[1]))
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, not {how!r}")


def weight_stats(w: torch.Tensor) -> dict[str, float]:
    """Mean and (population) variance of importance weights, as plain floats."""
    w = w.detach().double()
    if w.numel() == 0:
        return {"is_weight_mean": 0.0, "is_weight_var": 0.0}
    return {"is_weight_mean": w.mean().item(), "is_weight_var": w.var(unbiased=False).item()}


def frac(x: torch.Tensor) -> float:
    return x.float().mean().item() if x.numel() else 0.0
