"""Loss inputs from nested lists, for the policy losses' hand-computed tests (tests/unit/node/)."""

from __future__ import annotations

import torch

from node.algorithms.base import LossInputs

JUNK = -50.0
"""Values in padded positions; must never matter."""


def inputs(logp, old_logp, mask, adv, groups, **kw) -> LossInputs:
    """LossInputs in float64 (hand values hold to float64 rounding on any CPU), logp carrying the gradient."""
    return LossInputs(
        logp=torch.tensor(logp, dtype=torch.float64, requires_grad=True),
        old_logp=torch.tensor(old_logp, dtype=torch.float64),
        advantages=torch.tensor(adv, dtype=torch.float64),
        mask=torch.tensor(mask, dtype=torch.bool),
        group_ids=torch.tensor(groups),
        **kw,
    )
