"""From scored rollout groups to a step's batches: advantages per prompt group, packed sequences,
behaviour log-probs, and the routed parts a step trains on.

    groups --build_batch--> TrainBatch (packed sequences, behaviour log-probs, advantages)

Advantages are computed per prompt group before anything else (docs/DESIGN.md, "The algorithms");
groups with zero reward variance carry no signal and are skipped and counted, not trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from node.algorithms import Algorithm, group_advantages
from node.algorithms.base import seq_mean
from node.engines.base import Completion
from node.training.logprobs import PackedBatch, completion_span, pack


@dataclass
class ScoredGroup:
    """One prompt's G completions with the rewards the *learner* computed for them."""

    problem_id: str
    prompt_ids: list[int]
    completions: list[Completion]
    rewards: list[float]
    model_id: str
    version: int
    """Policy version of the weights that generated the completions."""
    behaviour_seq_logp: list[float] | None = None
    """Foreign tokenizer only: the generator's log-prob of each completion (the sum over its own
    tokens); `completions` then hold the learner's re-tokenization (and no per-token log-probs)."""
    claimed_logprobs: list[list[float]] | None = None
    """Where the learner recomputed the completions' behaviour log-probs (node/learner/behaviour.py):
    the sampler's claims they replaced, [completion][token], which the rollout correction weighs
    the engine's sampling by (TrainPart.rollout_cap)."""


@dataclass
class TrainBatch:
    packed: PackedBatch
    old_logp: torch.Tensor
    """[B, L-1] behaviour log-probs at the positions of packed.completion_mask."""
    advantages: torch.Tensor
    group_ids: torch.Tensor
    old_seq_logp: torch.Tensor | None
    """[B] for foreign-tokenizer batches (see ScoredGroup), else None."""
    groups_used: int
    groups_skipped: int
    """Groups dropped for zero reward variance."""
    rollout_log_weight: torch.Tensor | None = None
    """[B, L-1] log(p_old / q_engine) of each token: the behaviour log-probs less the claims they
    replaced (ScoredGroup.claimed_logprobs), 0 where nothing was replaced; None if no group was."""
    recomputed: torch.Tensor | None = None
    """[B] bool: the rows whose behaviour log-probs were recomputed (their weights are measured; the
    others' are 1 by construction and stay out of the weights' figures); None with no weights."""


def build_batch(groups: Sequence[ScoredGroup], normalize_std: bool, pad_id: int,
                keep_zero_variance: bool = False) -> TrainBatch | None:
    """Pack the groups that carry signal; None if none does. Tensors are on the CPU: train_step
    moves each micro-batch to the model's device, so a step's batch never sits whole on a GPU.
    `keep_zero_variance`: pack every group, those with equal rewards at advantage 0 (they then
    count in the batch's mean and in GEPO's E_hat, as GEPO's released code has it)."""
    rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float32, device="cpu")
    gids = torch.tensor([i for i, g in enumerate(groups) for _ in g.completions], dtype=torch.long, device="cpu")
    if rewards.numel() == 0:
        return None
    adv, zero_var = group_advantages(rewards, gids, normalize_std)
    keep = list(range(len(gids))) if keep_zero_variance else (~zero_var).nonzero().squeeze(-1).tolist()
    skipped = len({int(gids[i]) for i in range(len(gids))} - {int(gids[i]) for i in keep})
    if not keep:
        return None
    flat = [(g, c) for g in groups for c in g.completions]
    prompts = [flat[i][0].prompt_ids for i in keep]
    completions = [flat[i][1].token_ids for i in keep]
    packed = pack(prompts, completions, pad_id)
    old = torch.zeros_like(packed.completion_mask, dtype=torch.float32)
    seq_level = groups[0].behaviour_seq_logp is not None
    if any((g.behaviour_seq_logp is not None) != seq_level for g in groups):
        raise ValueError("build_batch: do not mix token-level and sequence-level groups in one batch")
    claims = [None if g.claimed_logprobs is None else g.claimed_logprobs[j]
              for g in groups for j in range(len(g.completions))]
    log_w = torch.zeros_like(old) if any(claims[i] is not None for i in keep) else None
    recomputed = None if log_w is None else torch.tensor([claims[i] is not None for i in keep], dtype=torch.bool)
    for row, i in enumerate(keep):
        if not seq_level:
            span = completion_span(len(prompts[row]), len(completions[row]))
            old[row, span] = torch.tensor(flat[i][1].logprobs, dtype=torch.float32, device="cpu")
            if log_w is not None and claims[i] is not None:
                log_w[row, span] = old[row, span] - torch.tensor(claims[i], dtype=torch.float32, device="cpu")
    seq_logp = None
    if seq_level:
        per_completion = [m for g in groups for m in g.behaviour_seq_logp]
        seq_logp = torch.tensor([per_completion[i] for i in keep], dtype=torch.float32, device="cpu")
    return TrainBatch(packed, old, adv[keep], gids[keep], seq_logp, len(groups) - skipped, skipped, log_w, recomputed)


@dataclass
class TrainPart:
    """One routed slice of a step: a batch and the loss that corrects it."""

    name: str
    batch: TrainBatch
    algo: Algorithm
    cfg: Any
    max_logprob_gap: float | None = None
    """Sequences whose claimed behaviour log-probs are further than this from the learner's own
    (mean |l^p - l^q| per token, nats) are dropped from the step (None: no check; see logprob_gap)."""
    rollout_cap: float | None = None
    """Truncated importance sampling of the rollout engine (Yao et al. 2025; decoupled PPO): each token
    of a recomputed group weighs p_old / q_engine, kept within [1 / cap, cap], in the loss
    (LossInputs.rollout_log_weight).
    None: no weight (the claims' engine is taken to be the learner's)."""


def logprob_gap(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """gap_i = mean_t |l^p_{i,t} - l^q_{i,t}|: [B, T] x 2 -> [B], no gradient.

    Behaviour log-probs are the sampler's claim; the learner's own are computed for the step
    anyway. Honest gaps come from staleness (the weights moved since version v), other engines'
    numerics and dtypes; they are small (docs/DESIGN.md, "Trust", measures them). A sampler
    claiming log-probs far below the truth is trying to inflate importance weights.
    """
    return seq_mean((logp.detach() - old_logp).abs(), mask)
