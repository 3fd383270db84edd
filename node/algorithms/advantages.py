"""Group-relative advantages (docs/DESIGN.md, "The algorithms").

A_i = r_i - mean_group(r), divided by std_group(r) + eps when `normalize_std` (GRPO, GSPO,
F-TIS by default; GEPO and Dr. GRPO not). std is the unbiased sample std, as in TRL. Groups whose
rewards are all equal carry no signal: they are reported in `zero_var` so the learner can skip
and count them.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, normalize_std: bool,
                     eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """rewards [B], group_ids [B] -> (advantages [B], zero_var [B] bool)."""
    _, inv = torch.unique(group_ids, return_inverse=True)
    n = int(inv.max()) + 1 if inv.numel() else 0
    r = rewards.double()
    count = torch.zeros(n, dtype=r.dtype, device=r.device).index_add(0, inv, torch.ones_like(r))
    mean = torch.zeros(n, dtype=r.dtype, device=r.device).index_add(0, inv, r) / count
    centred = r - mean[inv]
    sq = torch.zeros(n, dtype=r.dtype, device=r.device).index_add(0, inv, centred**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    zero_var = (sq[inv] <= 1e-12) | (count[inv] < 2)
    adv = centred / (std[inv] + eps) if normalize_std else centred
    adv = torch.where(zero_var, torch.zeros_like(adv), adv)
    return adv.to(rewards.dtype), zero_var


def has_signal(rewards: list[float]) -> bool:
    """False for a group `group_advantages` marks zero_var: fewer than 2 completions, or all rewards
    equal (sum of squared deviations <= 1e-12). Such a group is never trained on, so never credited."""
    if len(rewards) < 2:
        return False
    mean = sum(rewards) / len(rewards)
    return sum((r - mean) ** 2 for r in rewards) > 1e-12
