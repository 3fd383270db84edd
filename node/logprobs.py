"""Token log-probs of completions, computed one way for samplers and learners alike.

docs/DESIGN.md, "The algorithms": token log-probs come from logits divided by the sampling temperature. The HF
engine and the learner both call `completion_logprobs` (or `logprobs_from_logits` for
logits they already have), so behaviour and learner log-probs on the same weights agree to
floating-point noise (tests/test_engine.py measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / T)[token]. logits [..., V], tokens [...] -> [...] (float32)."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@dataclass
class PackedBatch:
    """Prompt+completion sequences, right-padded so that positions start at 0 for every row.

    input_ids [B, L]; attention_mask [B, L]; completion_mask [B, L-1] marks the positions t whose
    next-token prediction (of input_ids[:, t+1]) is a completion token.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor


def completion_span(prompt_len: int, n_tokens: int) -> slice:
    """Where a completion's tokens sit in a packed row of next-token log-probs ([B, L-1]): the
    prediction of token t is at position t-1, so the span starts at the prompt's last token."""
    return slice(prompt_len - 1, prompt_len - 1 + n_tokens)


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> PackedBatch:
    """Right-pad prompt+completion token lists into one batch (see PackedBatch)."""
    if len(prompts) != len(completions):
        raise ValueError("pack: one prompt per completion")
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    L = max(lengths)
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long)
    att = torch.zeros((len(prompts), L), dtype=torch.long)
    cmask = torch.zeros((len(prompts), max(L - 1, 1)), dtype=torch.bool)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if not p:
            raise ValueError("pack: a prompt must have at least one token")
        ids[i, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long)
        att[i, : len(p) + len(c)] = 1
        cmask[i, completion_span(len(p), len(c))] = True
    return PackedBatch(ids, att, cmask)


def completion_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """Per-position log-probs of the next token under `model`; [B, L-1], zero where masked.

    Differentiable: the learner calls it with grad enabled, samplers under no_grad.
    """
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = out.logits[:, :-1]  # predicts input_ids[:, 1:]
    lp = logprobs_from_logits(logits, batch.input_ids[:, 1:], temperature)
    return lp * batch.completion_mask
