"""From scored rollout groups to one optimizer step; shared by the local loop and the learner role.

    groups --build_batch--> TrainBatch (packed sequences, behaviour log-probs, advantages)
           --train_step---> loss.backward(), clip, optimizer.step(), metrics

Advantages are computed per prompt group before anything else (DESIGN section 4); groups with
zero reward variance carry no signal and are skipped and counted, not trained on.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .algorithms import Algorithm, LossInputs, group_advantages
from .engines.base import Completion
from .logprobs import PackedBatch, completion_logprobs, pack

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


@dataclass
class TrainBatch:
    packed: PackedBatch
    old_logp: torch.Tensor
    """[B, L-1] behaviour log-probs at the positions of packed.completion_mask."""
    advantages: torch.Tensor
    group_ids: torch.Tensor
    rewards: torch.Tensor
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
    for row, i in enumerate(keep):
        start = len(prompts[row]) - 1
        old[row, start : start + len(completions[row])] = torch.tensor(flat[i][1].logprobs, dtype=torch.float32)
    return TrainBatch(packed, old, adv[keep], gids[keep], rewards[keep], len(groups) - skipped, skipped)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrainBatch,
               algo: Algorithm, algo_cfg: Any, temperature: float, max_grad_norm: float = 1.0) -> dict[str, float]:
    """One optimizer step on `batch` with `algo`'s loss; returns the loss's diagnostics and more."""
    model.train()
    logp = completion_logprobs(model, batch.packed, temperature)
    inputs = LossInputs(logp, batch.old_logp, batch.advantages, batch.packed.completion_mask, batch.group_ids)
    out = algo.loss(inputs, algo_cfg)
    optimizer.zero_grad(set_to_none=True)
    if not torch.isfinite(out.loss):
        # NaN/inf input can give a NaN loss with a *finite* gradient (clamp's backward zeroes the
        # NaN path), so the loss is checked first: one poisoned batch must not move the weights.
        log.warning("non-finite loss (%s); optimizer step skipped", out.loss.item())
        return {**out.metrics, "loss": float("nan"), "grad_norm": float("nan"), "step_skipped": 1.0}
    out.loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if not torch.isfinite(grad_norm):
        log.warning("non-finite gradient norm (%s); optimizer step skipped", grad_norm.item())
        optimizer.zero_grad(set_to_none=True)
        return {**out.metrics, "loss": out.loss.item(), "grad_norm": float("nan"), "step_skipped": 1.0}
    optimizer.step()
    model.eval()
    return {**out.metrics, "loss": out.loss.item(), "grad_norm": grad_norm.item(), "step_skipped": 0.0}
