"""Typed loss inputs/outputs and the small pieces every policy loss shares.

Shapes: B sequences (completions), T completion positions (padded). `mask` [B, T] marks real
completion tokens; `group_ids` [B] says which completions answer the same prompt.

Micro-batches: a loss may see only some rows of the step's batch (node/training/step.py splits a step
under a token budget, and may split a group). Every loss is a sum of per-row terms over fixed
normalisers plus group statistics of the *behaviour* log-probs, so `LossInputs.whole` (the step's
shape) and `LossInputs.log_e_hat` (its group statistics) are all a micro-batch needs: the
micro-batch losses then sum to the whole batch's loss, and their gradients to its gradient.
Every tensor made here lives on the inputs' device (tests/unit/node/test_algorithms.py checks that with
torch's default device set to `meta`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

LOG_RATIO_MAX = 20.0
"""Log importance ratios are clamped to +-20 (e^20 ~ 5e8) before exp: beyond that a ratio is
already clipped or truncated by every loss here, and the clamp keeps exp() and its gradient
finite for extreme log-prob gaps (a -1e4 log-prob from a foreign model is real input)."""


DUAL_CLIP = 3.0
"""Dual-clip bound c (Ye et al. 2020, arXiv 1912.09729): for A < 0 the PPO loss is capped at
c |A|, so a ratio r > c (behaviour log-probs claimed far below the learner's) has no gradient."""


@dataclass(frozen=True)
class BatchShape:
    """The step's whole batch, as the normalisers of a loss computed on part of it need it."""

    sequences: int
    """B: sequence means (GRPO's seq_mean, GEPO, GSPO) divide by it."""
    tokens: int
    """Completion tokens: DAPO's token_mean divides by it."""
    completion_len: int
    """Longest completion: Dr. GRPO's constant when its config gives none."""

    @classmethod
    def of(cls, mask: torch.Tensor) -> "BatchShape":
        lengths = mask.sum(-1)
        return cls(int(mask.shape[0]), int(lengths.sum()), max(int(lengths.max()) if lengths.numel() else 0, 1))


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
    old_seq_logp: torch.Tensor | None = None
    """[B] optional: the behaviour model's log-probability of the whole completion (the sum over
    *its own* tokens), for foreign rollouts whose tokenizer differs (F-TIS then works at sequence
    level: log p(text) - log g(text) compares the same text whatever the tokenizations)."""
    whole: BatchShape | None = None
    """The step's batch when these rows are a micro-batch of it; None: these rows are the batch."""
    log_e_hat: torch.Tensor | None = None
    """[B] log E_hat of each row's group (group_log_e_hat) over the whole batch; None: computed
    from these rows, which must then hold whole groups."""
    rollout_log_weight: torch.Tensor | None = None
    """[B, T] optional, no gradient: the log of each token's truncated importance weight
    p_old / q_engine (within [1/C, C]) from the policy whose log-probs are `old_logp` (the
    learner's own, recomputed) to the engine that sampled the token (the sampler's claims): the
    rollout correction of decoupled PPO (node/training/step.rollout_weight). Token-level losses multiply
    each token's term by the weight, sequence-level ones each sequence's term by its geometric mean
    (`seq_rollout`). None: weight 1."""

    def __post_init__(self) -> None:
        B, T = self.logp.shape
        if self.old_logp.shape != (B, T) or self.mask.shape != (B, T):
            raise ValueError(f"logp {tuple(self.logp.shape)}, old_logp {tuple(self.old_logp.shape)} "
                             f"and mask {tuple(self.mask.shape)} must all be [B, T]")
        if self.advantages.shape != (B,) or self.group_ids.shape != (B,):
            raise ValueError("advantages and group_ids must be [B]")
        if self.rollout_log_weight is not None and self.rollout_log_weight.shape != (B, T):
            raise ValueError(f"rollout_log_weight {tuple(self.rollout_log_weight.shape)} must be [B, T] like logp")
        self.mask = self.mask.bool()
        if self.whole is None:
            self.whole = BatchShape.of(self.mask)


@dataclass
class LossOutput:
    loss: torch.Tensor
    """Scalar to minimise."""
    metrics: dict[str, float] = field(default_factory=dict)
    """is_weight_mean, is_weight_var, clip_frac, kl_k3 (+ filtered_frac, truncated_frac for F-TIS)."""


def seq_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each row's masked tokens: [B, T] -> [B]; 0 for an empty row."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def token_rollout(per_token: torch.Tensor, inp: LossInputs) -> torch.Tensor:
    """A token-level loss's [B, T] terms, each times its rollout weight (`LossInputs.rollout_log_weight`)."""
    return per_token if inp.rollout_log_weight is None else per_token * inp.rollout_log_weight.detach().exp()


def seq_rollout(per_seq: torch.Tensor, inp: LossInputs) -> torch.Tensor:
    """A sequence-level loss's [B] terms, each times the geometric mean of its tokens' rollout
    weights: the weight at the scale of a length-normalised sequence ratio (GSPO's, GEPO's)."""
    if inp.rollout_log_weight is None:
        return per_seq
    return per_seq * seq_mean(inp.rollout_log_weight.detach(), inp.mask).exp()


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """k3 KL estimator exp(d) - d - 1 of d = log(a/b) (Schulman): >= 0, unbiased, low variance."""
    d = log_ratio.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
    return torch.exp(d) - d - 1


def k3_bounded(log_ratio: torch.Tensor, dual_clip: float = DUAL_CLIP) -> torch.Tensor:
    """k3 of d = log(q/p) for a *loss* (gradient through p): d is capped at log c first, so its
    gradient 1 - exp(d) lies in (1 - c, 1] whatever q a sampler claims (unbounded otherwise)."""
    return k3(log_ratio.clamp(max=math.log(dual_clip)))


def group_logsumexp(x: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """logsumexp of x over each element's group, returned per element: [B] -> [B]."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1
    gmax = torch.full((n,), -torch.inf, dtype=x.dtype, device=x.device).scatter_reduce(0, inv, x, "amax")
    sums = torch.zeros(n, dtype=x.dtype, device=x.device).index_add(0, inv, torch.exp(x - gmax[inv]))
    return (torch.log(sums) + gmax)[inv]


def group_log_e_hat(old_logp: torch.Tensor, mask: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """GEPO's group expectation log E_hat = log(sum_j q_j^2 / sum_j q_j), per row: [B, T] -> [B].

    q_j = exp(mean_t l^q_{j,t}) is completion j's length-normalised behaviour probability; only
    behaviour log-probs enter, so it is known before any forward pass (and for split groups)."""
    lq = seq_mean(old_logp, mask).detach()
    return group_logsumexp(2 * lq, group_ids) - group_logsumexp(lq, group_ids)


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float,
                      dual_clip: float = DUAL_CLIP, truncate: bool = False):
    """Dual-clip PPO, per element:

        L = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)         A >= 0
        L = min(-min(r A, clip(r, ...) A), -c A)                   A < 0
        L = -c A r / sg(r)    where the cap binds, with `truncate`   (value -c A, gradient -c A grad log r)

    and where a clip bites. Plain PPO bounds the gradient weight r of an element only for A > 0
    (and for r < 1 - eps); for A < 0 the min takes the unclipped branch and r is unbounded, so
    one sequence with forged behaviour log-probs could set the step's direction. With the dual
    clip every element's gradient weight is at most max(1 + eps_high, c) |A| for either sign:
    bounded influence whatever a sampler claims.
    """
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * adv
    per = -torch.minimum(unclipped, clipped)
    cap = -dual_clip * adv
    dual = (adv < 0) & (per > cap)
    if truncate and math.isfinite(dual_clip):
        cap = cap * (ratio / ratio.detach())  # r / sg(r): value 1, gradient grad log r
    return torch.where(dual, cap, per), (clipped < unclipped) | dual


AGGREGATIONS = ("seq_mean", "token_mean", "dr_grpo")


def batch_mean(per_seq: torch.Tensor, whole: BatchShape) -> torch.Tensor:
    """sum_i x_i / B over the whole batch's B (these rows' share of the batch mean)."""
    return per_seq.sum() / whole.sequences


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, how: str, whole: BatchShape,
              max_tokens: int | None = None) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to these rows' share of the whole batch's scalar.

    seq_mean   (GRPO): mean over a sequence's tokens, then over sequences.
    token_mean (DAPO): sum over all tokens / number of tokens.
    dr_grpo    (Dr. GRPO, Liu et al. 2025): sum over all tokens / (B * max_tokens), a constant,
               so long wrong answers are not favoured by length normalisation.
    """
    if how == "seq_mean":
        return batch_mean(seq_mean(per_token, mask), whole)
    if how == "token_mean":
        return (per_token * mask).sum() / max(whole.tokens, 1)
    if how == "dr_grpo":
        return (per_token * mask).sum() / (whole.sequences * (max_tokens or whole.completion_len))
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}, not {how!r}")


def weight_stats(w: torch.Tensor) -> dict[str, float]:
    """Mean and (population) variance of importance weights, as plain floats."""
    w = w.detach().double()
    if w.numel() == 0:
        return {"is_weight_mean": 0.0, "is_weight_var": 0.0}
    return {"is_weight_mean": w.mean().item(), "is_weight_var": w.var(unbiased=False).item()}


DRIFT_LOG = math.log(1.2)
"""|log(p/q)| past which a token counts as drifted: GRPO's clip (0.2) on either side, about."""


def drift_stats(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, advantages: torch.Tensor) -> dict[str, float]:
    """How far the learner's policy p has moved from the sampler's q on these tokens, whatever the
    loss: the share of tokens with |log(p/q)| > log 1.2, and the mean token weight p/q on rows of
    positive and of negative advantage (1.0 where there is no such row). A loss whose weights stay
    near 1 while these drift bounds less than its weights suggest (docs/RESULTS.md)."""
    d = (logp.detach() - old_logp.detach()).double().clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)
    m = mask.bool()
    w = torch.exp(d)
    out = {"drift_frac": frac((d.abs() > DRIFT_LOG)[m])}
    for name, rows in (("weight_mean_pos", advantages > 0), ("weight_mean_neg", advantages < 0)):
        sel = m & rows.reshape(-1, 1)
        out[name] = w[sel].mean().item() if sel.any() else 1.0
    return out


def frac(x: torch.Tensor) -> float:
    return x.float().mean().item() if x.numel() else 0.0
