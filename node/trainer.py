"""From scored rollout groups to one optimizer step; shared by the local loop and the learner role.

    groups --build_batch--> TrainBatch (packed sequences, behaviour log-probs, advantages)
           --train_step---> loss.backward(), clip, optimizer.step(), metrics

Advantages are computed per prompt group before anything else (docs/DESIGN.md, "The algorithms"); groups with
zero reward variance carry no signal and are skipped and counted, not trained on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .algorithms import Algorithm, LossInputs, group_advantages
from .algorithms.base import seq_mean
from .engines.base import Completion
from .logprobs import PackedBatch, completion_logprobs, completion_span, pack

log = logging.getLogger(__name__)


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
    behaviour_seq_logp_mean: list[float] | None = None
    """Foreign tokenizer only: the generator's mean token log-prob per completion on its own
    tokens; `completions` then hold the learner's re-tokenization (and no per-token log-probs)."""


@dataclass
class TrainBatch:
    packed: PackedBatch
    old_logp: torch.Tensor
    """[B, L-1] behaviour log-probs at the positions of packed.completion_mask."""
    advantages: torch.Tensor
    group_ids: torch.Tensor
    old_seq_logp_mean: torch.Tensor | None
    """[B] for foreign-tokenizer batches (see ScoredGroup), else None."""
    groups_used: int
    groups_skipped: int
    """Groups dropped for zero reward variance."""


def build_batch(groups: Sequence[ScoredGroup], normalize_std: bool, pad_id: int) -> TrainBatch | None:
    """Pack the groups that carry signal; None if none does."""
    rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float32)
    gids = torch.tensor([i for i, g in enumerate(groups) for _ in g.completions])
    if rewards.numel() == 0:
        return None
    adv, zero_var = group_advantages(rewards, gids, normalize_std)
    keep = (~zero_var).nonzero().squeeze(-1).tolist()
    skipped = len({int(gids[i]) for i in range(len(gids))} - {int(gids[i]) for i in keep})
    if not keep:
        return None
    flat = [(g, c) for g in groups for c in g.completions]
    prompts = [flat[i][0].prompt_ids for i in keep]
    completions = [flat[i][1].token_ids for i in keep]
    packed = pack(prompts, completions, pad_id)
    old = torch.zeros_like(packed.completion_mask, dtype=torch.float32)
    seq_level = groups[0].behaviour_seq_logp_mean is not None
    if any((g.behaviour_seq_logp_mean is not None) != seq_level for g in groups):
        raise ValueError("build_batch: do not mix token-level and sequence-level groups in one batch")
    for row, i in enumerate(keep):
        if not seq_level:
            span = completion_span(len(prompts[row]), len(completions[row]))
            old[row, span] = torch.tensor(flat[i][1].logprobs, dtype=torch.float32)
    seq_means = None
    if seq_level:
        per_completion = [m for g in groups for m in g.behaviour_seq_logp_mean]
        seq_means = torch.tensor([per_completion[i] for i in keep], dtype=torch.float32)
    return TrainBatch(packed, old, adv[keep], gids[keep], seq_means, len(groups) - skipped, skipped)


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


def logprob_gap(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """gap_i = mean_t |l^p_{i,t} - l^q_{i,t}|: [B, T] x 2 -> [B], no gradient.

    Behaviour log-probs are the sampler's claim; the learner's own are computed for the step
    anyway. Honest gaps come from staleness (the weights moved since version v), other engines'
    numerics and dtypes; they are small (docs/DESIGN.md, "Trust", measures them). A sampler
    claiming log-probs far below the truth is trying to inflate importance weights.
    """
    return seq_mean((logp.detach() - old_logp).abs(), mask)


WEIGHTED_METRICS = ("is_weight_mean", "is_weight_var", "clip_frac", "kl_k3", "filtered_frac", "truncated_frac")


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, parts: Sequence[TrainPart],
               temperature: float, max_grad_norm: float = 1.0) -> dict[str, Any]:
    """One optimizer step on all `parts`; each part's loss is weighted by its number of sequences.

    Returns the diagnostics averaged over parts (sequence-weighted) and per part under "routes".
    """
    model.train()
    kept = []  # (part, logp, keep [B]) for parts with at least one sequence left
    routes: dict[str, dict[str, Any]] = {}
    for part in parts:
        b = part.batch
        logp = completion_logprobs(model, b.packed, temperature)
        keep = torch.ones_like(b.advantages, dtype=torch.bool)
        if part.max_logprob_gap is not None:
            gap = logprob_gap(logp, b.old_logp, b.packed.completion_mask)
            keep = gap <= part.max_logprob_gap  # NaN claims fail this too
            routes[part.name] = {"logprob_gap_mean": gap.mean().item(), "logprob_gap_max": gap.max().item(),
                                 "dropped_groups": sorted({int(i) for i in b.group_ids[~keep]})}
        if keep.any():
            kept.append((part, logp, keep))
    total = sum(int(keep.sum()) for _, _, keep in kept)
    loss = torch.zeros(())
    for part, logp, keep in kept:
        b = part.batch
        seq = b.old_seq_logp_mean[keep] if b.old_seq_logp_mean is not None else None
        out = part.algo.loss(LossInputs(logp[keep], b.old_logp[keep], b.advantages[keep],
                                        b.packed.completion_mask[keep], b.group_ids[keep], seq), part.cfg)
        share = int(keep.sum()) / total
        loss = loss + share * out.loss
        routes[part.name] = {**routes.get(part.name, {}), **out.metrics, "loss": out.loss.item(),
                             "sequences": int(keep.sum()), "share": share}
    metrics: dict[str, Any] = {k: sum(r[k] * r["share"] for r in routes.values() if k in r)
                               for k in WEIGHTED_METRICS if any(k in r for r in routes.values())}
    metrics["routes"] = routes
    optimizer.zero_grad(set_to_none=True)
    if not kept:
        log.warning("every sequence of the step failed the log-prob check; optimizer step skipped")
        model.eval()
        return {**metrics, "loss": float("nan"), "grad_norm": float("nan"), "step_skipped": 1.0}
    if not torch.isfinite(loss):
        # NaN/inf input can give a NaN loss with a *finite* gradient (clamp's backward zeroes the
        # NaN path), so the loss is checked first: one poisoned batch must not move the weights.
        log.warning("non-finite loss (%s); optimizer step skipped", loss.item())
        model.eval()
        return {**metrics, "loss": float("nan"), "grad_norm": float("nan"), "step_skipped": 1.0}
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    model.eval()
    if not torch.isfinite(grad_norm):
        log.warning("non-finite gradient norm (%s); optimizer step skipped", grad_norm.item())
        optimizer.zero_grad(set_to_none=True)
        return {**metrics, "loss": loss.item(), "grad_norm": float("nan"), "step_skipped": 1.0}
    optimizer.step()
    return {**metrics, "loss": loss.item(), "grad_norm": grad_norm.item(), "step_skipped": 0.0}
