"""GRPO with a sequence-level drift mask: masked importance sampling at sequence level (MIS;
Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
Mismatch"; ms-swift's `rollout_importance_sampling_mode = sequence_mask`), on top of GRPO's token
clip (node/algorithms/grpo.py).

With d_{i,t} = l^p_{i,t} - l^q_{i,t} (no gradient) and n_i the real tokens of completion i:

    D_i     = sum_t d_{i,t}                       = log rho(y_i), the sequence's log ratio
    keep_i  = |D_i| <= delta * n_i^k              (k = `length_power`, 0.5 by default)
    L       = agg_{i,t} keep_i * GRPO_{i,t}       (GRPO's per-token term, its KL term included)

A dropped sequence weighs 0, and the normalisers stay the whole batch's (B sequences, its tokens):
dropping removes a sequence's push and never scales up the others' (as the trainer's log-prob check
does, node/training/step.py; slime's MIS takes the normaliser over the kept tokens instead). The
mask needs only the sequence's own tokens, so micro-batch losses still sum to the batch's.
On-policy (p = q) every D_i is 0, every sequence is kept, and the loss and its gradient are GRPO's
exactly (the same operations, then a `where` that keeps every term).

Why a bound in sqrt(n): GRPO's clip already bounds each token's own ratio; what it cannot see is a
sequence every token of which moved a little the same way (0.1 nats each is inside its [0.8, 1.2]
on every token, and 6 nats over 60 tokens). Per-token noise of scale s (a stale sampler's, a
low-precision engine's) that does not agree in sign adds up to D_i ~ s sqrt(n); a coherent drift
of mu per token to mu n. A bound delta sqrt(n) lets noise below delta per token through at any
length and masks a coherent drift once mu > delta / sqrt(n): a long sequence's drift is measured
better, so it is held to a tighter per-token bound. A constant bound (k = 0: seq-MIS's bound on
rho(y)) masks long sequences for their noise alone; a bound in n (k = 1: a bound on the mean
per-token drift, a geometric-mean mask) dilutes one runaway token by 1/n, the failure docs/RESULTS.md
found in GEPO's clip of a length-normalised ratio. Both stay one config value away. The same
sqrt(n) narrowing is `gepo-lenclip`'s (node/algorithms/gepo.py).

delta = log 1.2 (base.DRIFT_LOG) by default: a one-token sequence is dropped exactly where the
trainer's diagnostics count a token as drifted (|log p/q| > log 1.2, GRPO's clip on either side,
about); 60 tokens may drift 1.41 nats in all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from node.algorithms.base import DRIFT_LOG, LossInputs, LossOutput, aggregate, frac, seq_mean
from node.algorithms.grpo import GRPOConfig, grpo_metrics, grpo_terms


@dataclass(frozen=True)
class GRPOSeqMaskConfig(GRPOConfig):
    delta: float = DRIFT_LOG
    """Bound on a sequence's |log rho(y)| per n^length_power of its tokens (above)."""
    length_power: float = 0.5
    """k of the bound delta * n^k: 0.5 ours (noise passes at any length), 0 a constant bound on
    |log rho(y)| (seq-MIS), 1 a bound on the mean per-token log ratio (a geometric-mean mask)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.delta > 0 or not 0 <= self.length_power <= 1:
            raise ValueError(f"grpo_seqmask: need delta > 0 and 0 <= length_power <= 1, not {self.delta} and "
                             f"{self.length_power} (0.5: the bound delta sqrt(n) that lets per-token noise through)")


def seq_drift_keep(inp: LossInputs, delta: float, length_power: float) -> torch.Tensor:
    """[B] bool, no gradient: True where |sum_t (l^p - l^q)| <= delta * n^length_power (an empty
    completion is kept: it weighs nothing either way)."""
    n = inp.mask.sum(-1).to(inp.logp.dtype)
    drift = seq_mean(inp.logp.detach() - inp.old_logp.detach(), inp.mask) * n  # sum over the real tokens
    return drift.abs() <= delta * n**length_power


def grpo_seqmask_loss(inp: LossInputs, cfg: GRPOSeqMaskConfig) -> LossOutput:
    per_token, clipped, ratio = grpo_terms(inp, cfg)
    keep = seq_drift_keep(inp, cfg.delta, cfg.length_power)
    per_token = torch.where(keep[:, None], per_token, 0.0)  # a dropped sequence: no value, no gradient
    loss = aggregate(per_token, inp.mask, cfg.aggregation, inp.whole, cfg.dr_grpo_max_tokens)
    # GRPO's diagnostics over every real token (comparable with GRPO's runs), and the share dropped
    return LossOutput(loss, {**grpo_metrics(inp, clipped, ratio), "masked_frac": frac(~keep)})
