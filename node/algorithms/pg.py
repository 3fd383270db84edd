"""No off-policy correction: the on-policy GRPO gradient applied as if behaviour = learner.

    R_{i,t} = exp(l^p_{i,t} - sg(l^p_{i,t}))      (value 1, gradient of l^p)
    L = agg_{i,t} -R_{i,t} A_i

The behaviour log-probs are ignored (they only feed the k3 diagnostic). This is the "no
correction" baseline of the heterogeneous experiment: what F-TIS and GEPO are compared against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from node.algorithms.base import LossInputs, LossOutput, aggregate, k3, seq_mean, token_rollout


@dataclass(frozen=True)
class PGConfig:
    aggregation: str = "seq_mean"
    dr_grpo_max_tokens: int | None = None
    normalize_std: bool = True


def pg_loss(inp: LossInputs, cfg: PGConfig) -> LossOutput:
    ratio = torch.exp(inp.logp - inp.logp.detach())
    per_token = token_rollout(-ratio * inp.advantages[:, None], inp)
    loss = aggregate(per_token, inp.mask, cfg.aggregation, inp.whole, cfg.dr_grpo_max_tokens)
    return LossOutput(loss, {
        "is_weight_mean": 1.0, "is_weight_var": 0.0, "clip_frac": 0.0,
        "kl_k3": seq_mean(k3(inp.old_logp.detach() - inp.logp).detach(), inp.mask).mean().item(),
    })
