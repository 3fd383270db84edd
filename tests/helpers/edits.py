"""A cheat's edit that honest rounding could also make, now and then: one token replaced by a token
whose race margin lies in a band of logits, claimed with its honest log-prob (the attack the audit's
exceedance test exists for: node/audit/margins.py, AuditConfig.margin and margin_hard).

    margin = edit_past_margin(model, tok, params, seed, completion, prompt, lo, hi, slack, hard)
"""

from __future__ import annotations

import torch

from node.audit.margins import margins_at
from node.sampling.params import SamplingParams
from node.sampling.race import keys_tensor, position_keys
from node.training.logprobs import completion_logits, logprobs_from_logits, pack


@torch.no_grad()
def edit_past_margin(model: torch.nn.Module, tok, params: SamplingParams, seed: bytes, completion, prompt: str,
                     lo: float, hi: float, slack: float, hard: float) -> float:
    """`completion` (a swarm.wire.rollout.CompletionRecord drawn with race `seed` by `model`) with
    its latest token that can be replaced by one whose race margin is in (lo, hi] so replaced,
    claimed with its honest log-prob, and ending there (what follows would be drawn again, so a
    cut completion: finish "length"): a token the policy could well have drawn, but not the one its
    race selects, by more than honest rounding usually explains. Returns its margin as the audit
    measures it (node/audit/margins.margins_at: top-k / top-p applied with `slack`, the hard bound
    `hard`); AssertionError if no position has such a token."""
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    batch = pack([prompt_ids], [completion.token_ids], tok.pad_token_id)
    logits = torch.cat([x for _, x in completion_logits(model, batch)])
    keys, vocab = keys_tensor(position_keys(seed, len(completion.token_ids)), logits.device), logits.shape[-1]
    for t in reversed(range(len(completion.token_ids))):  # every token of the vocabulary's margin at t
        margins = margins_at(logits[t].expand(vocab, -1), torch.arange(vocab, device=logits.device),
                             keys[t].expand(vocab, -1), params, slack, hard)
        band = ((margins > lo) & (margins <= hi)).nonzero().flatten()
        if len(band):
            v = int(band[margins[band].argmin()])
            completion.token_ids = completion.token_ids[:t] + [v]
            completion.logprobs = completion.logprobs[:t] + [
                float(logprobs_from_logits(logits[t : t + 1], torch.tensor([v], device=logits.device), params.logprob_temperature))]
            completion.text = tok.decode(completion.token_ids, skip_special_tokens=True)
            completion.finish_reason = "length"
            return float(margins[v])
    raise AssertionError(f"no token lies {lo} to {hi} logits behind the race's at any position")
