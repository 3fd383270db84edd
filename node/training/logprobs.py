"""Token log-probs of completions, computed one way for samplers and learners alike.

docs/DESIGN.md, "The algorithms": token log-probs come from logits divided by the sampling
temperature. The HF engine and the learner both go through `logprobs_from_logits`, so behaviour
and learner log-probs on the same weights agree to floating-point noise (tests/unit/node/test_engine.py
measures it).

Memory at LLM scale: the learner needs log-probs of completion tokens only, and never the
[B, L, V] logits (151k vocabulary x 128 completions x 1k tokens is ~80 GB in float32).
`completion_logprobs` runs the transformer body, keeps the hidden states of completion positions,
and applies the output head in chunks of positions; with gradients on, each chunk is
checkpointed, so at most one chunk's [chunk, V] logits exist at a time, forward or backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from torch.utils.checkpoint import checkpoint

HEAD_CHUNK_BYTES = 1 << 28
"""Float32 logits per output-head chunk (256 MiB: ~440 positions of a 151k vocabulary)."""


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

    def rows(self, idx: list[int]) -> "PackedBatch":
        """The rows `idx`, trimmed to their own longest row (right padding makes that a column cut)."""
        sel = torch.tensor(idx, dtype=torch.long, device=self.input_ids.device)
        L = int(self.attention_mask[sel].sum(-1).max())
        return PackedBatch(self.input_ids[sel, :L], self.attention_mask[sel, :L], self.completion_mask[sel, : max(L - 1, 1)])

    def to(self, device: torch.device | str) -> "PackedBatch":
        return PackedBatch(self.input_ids.to(device), self.attention_mask.to(device), self.completion_mask.to(device))


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
    ids = torch.full((len(prompts), L), pad_id, dtype=torch.long, device="cpu")
    att = torch.zeros((len(prompts), L), dtype=torch.long, device="cpu")
    cmask = torch.zeros((len(prompts), max(L - 1, 1)), dtype=torch.bool, device="cpu")
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if not p:
            raise ValueError("pack: a prompt must have at least one token")
        ids[i, : len(p) + len(c)] = torch.tensor(p + c, dtype=torch.long, device="cpu")
        att[i, : len(p) + len(c)] = 1
        cmask[i, completion_span(len(p), len(c))] = True
    return PackedBatch(ids, att, cmask)


def _head_logits(hidden: torch.Tensor, head: torch.nn.Linear, softcap: float | None) -> torch.Tensor:
    """Float32 logits [N, V] of final hidden states [N, H] through the output head (float64 for a
    float64 model, so tests can compare two computations in float64)."""
    logits = head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if softcap:  # Gemma-style final logit soft-capping is part of the model's distribution
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def _head_logprobs(hidden: torch.Tensor, tokens: torch.Tensor, head: torch.nn.Linear,
                   temperature: float, softcap: float | None) -> torch.Tensor:
    """log-probs of `tokens` [N] from final hidden states [N, H] through the output head."""
    logits = _head_logits(hidden, head, softcap)  # a fresh tensor that nothing else holds: scaled in place
    if temperature != 1.0:
        logits = logits.div_(temperature)
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class CompletionLogprobs(torch.nn.Module):
    """A causal LM as a module whose forward is `completion_logprobs`.

    FSDP2 (node/training/distributed.py) shards this as its root: its hooks then gather the embedding,
    final norm and head weights around the whole computation, the chunked head included, which
    calling the LM's body and head separately would bypass."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor,
                temperature: float) -> torch.Tensor:
        return completion_logprobs(self.lm, PackedBatch(input_ids, attention_mask, completion_mask), temperature)


def _split(model: torch.nn.Module) -> tuple[torch.nn.Module | None, torch.nn.Linear | None, int]:
    """(body, head, positions per head chunk) of an HF causal LM; (None, None, 0) for a model
    whose head is not a plain linear layer (it takes the full-logits path)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = getattr(model, "base_model", None)
    if not isinstance(head, torch.nn.Linear) or body is None or body is model:
        return None, None, 0
    return body, head, max(1, HEAD_CHUNK_BYTES // (4 * head.out_features))


@torch.no_grad()
def completion_logits(model: torch.nn.Module, batch: PackedBatch) -> Iterator[tuple[slice, torch.Tensor]]:
    """Raw float32 logits of the completion positions (in `completion_mask`'s row-major order), in
    chunks under HEAD_CHUNK_BYTES: (slice of those positions, [chunk, V]). For audits, which need
    whole next-token distributions; never the [B, L, V] logits of a head-chunkable model."""
    body, head, chunk = _split(model)
    mask = batch.completion_mask
    if body is None:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        yield slice(0, int(mask.sum())), logits[:, :-1][mask].float()
        return
    h = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state[:, :-1][mask]
    softcap = getattr(model.config, "final_logit_softcapping", None)
    for s in range(0, h.shape[0], chunk):
        yield slice(s, s + chunk), _head_logits(h[s : s + chunk], head, softcap)


def completion_logprobs(model: torch.nn.Module, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """Per-position log-probs of the next token under `model`; [B, L-1] float32 (float64 for a
    float64 model), zero where masked.

    Differentiable: the learner calls it with grad enabled, samplers and audits under no_grad.
    Only completion positions go through the output head (see the module docstring); a model whose
    head is not a plain linear layer takes the full-logits path.
    """
    if isinstance(model, CompletionLogprobs):
        return model(batch.input_ids, batch.attention_mask, batch.completion_mask, temperature)
    body, head, chunk = _split(model)
    targets = batch.input_ids[:, 1:]
    if body is None:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        return logprobs_from_logits(out.logits[:, :-1], targets, temperature) * batch.completion_mask
    hidden = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).last_hidden_state
    mask = batch.completion_mask
    h, tok = hidden[:, :-1][mask], targets[mask]  # [N, H], [N]: completion positions only
    softcap = getattr(model.config, "final_logit_softcapping", None)
    pieces = []
    for s in range(0, h.shape[0], chunk):
        args = (h[s : s + chunk], tok[s : s + chunk], head, temperature, softcap)
        if torch.is_grad_enabled() and h.requires_grad:
            # recompute this chunk's logits in backward instead of keeping [chunk, V] per chunk
            pieces.append(checkpoint(_head_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_head_logprobs(*args))
    lp = torch.cat(pieces) if pieces else h.new_zeros(0, dtype=torch.float32)
    return torch.zeros(mask.shape, dtype=lp.dtype, device=lp.device).masked_scatter(mask, lp)
