"""The generation-engine seam: G completions per prompt with behaviour log-probs.

Engines (HF transformers now, vLLM for GPU samplers) differ in speed, never in what they return.
Behaviour log-probs are log softmax(logits / T) of the sampled token under the *unfiltered*
tempered distribution: top-p / top-k change which tokens can be drawn, not the log-probs we
report, because the learner's own log-probs (node/training/logprobs.py) are unfiltered too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from node.sampling.params import SamplingParams


@dataclass
class Completion:
    token_ids: list[int]
    """Sampled tokens, the final EOS included when the completion stopped on it."""
    text: str
    """Decoded tokens without special tokens."""
    logprobs: list[float]
    """Behaviour log-prob of each token in `token_ids` (see module docstring)."""
    finish_reason: str
    """'stop' (EOS sampled) or 'length' (max_new_tokens reached)."""


@dataclass
class PromptResult:
    prompt: str
    prompt_token_ids: list[int]
    completions: list[Completion] = field(default_factory=list)


class Engine(Protocol):
    model_id: str
    version: int
    """Policy version of the weights generating right now."""

    def generate(self, prompts: list[str], params: SamplingParams,
                 seeds: list[list[bytes]] | None = None) -> list[PromptResult]:
        """G = params.n completions per prompt. With `seeds` (seeds[i][j] for completion j of
        prompt i), sampling is checkable (node/sampling/race.py): token t of that completion is the
        race keyed by `position_keys(seeds[i][j], ...)[t]` selects, so a learner can audit it."""
        ...

    def load_weights(self, state_dict: dict, version: int) -> None:
        """Swap in new weights (between generate calls) and record their version."""
        ...
