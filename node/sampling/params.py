"""How completions are drawn: the `[sampling]` table (`SamplingConfig`) and what an engine takes
(`SamplingParams`), one derived from the other, each default declared once.

The learner computes log-probs at this temperature and refuses records sampled otherwise; every
sampler draws with these settings; checkable sampling's race (race.py) and the audit reproduce them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """What one generation call of an engine takes (node/engines/base.py)."""

    n: int
    """Completions per prompt (the group size G)."""
    max_new_tokens: int
    temperature: float = 1.0
    """0 means greedy (log-probs are then reported at T = 1)."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""

    def __post_init__(self) -> None:
        if self.n < 1 or self.max_new_tokens < 1:
            raise ValueError("sampling: n and max_new_tokens must be >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("sampling: need temperature >= 0, 0 < top_p <= 1, top_k >= 0")

    @property
    def logprob_temperature(self) -> float:
        return self.temperature if self.temperature > 0 else 1.0


@dataclass(frozen=True)
class SamplingConfig:
    """How completions are drawn: one `[sampling]` table, read by the learner (which computes
    log-probs at this temperature and refuses other records) and by every sampler."""

    group_size: int = 8
    """Completions per prompt (G); advantages are relative to the group."""
    temperature: float = SamplingParams.temperature
    top_p: float = SamplingParams.top_p
    top_k: int = SamplingParams.top_k
    """0 disables top-k."""
    max_new_tokens: int = 6

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError("sampling.group_size must be >= 2: advantages are relative to the group")
        self.params  # SamplingParams checks the rest

    @property
    def params(self) -> SamplingParams:
        return SamplingParams(n=self.group_size, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=self.max_new_tokens)
