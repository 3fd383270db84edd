"""A checked record made trainable: rewards recomputed by the task's verifier (the sampler's claim
is only compared), the prompt tokenized, and a foreign tokenizer's completions re-tokenized."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.records import RolloutGroup

from ..engines.base import Completion
from ..tasks import Task
from ..trainer import ScoredGroup
from .groups import Route


@dataclass(frozen=True)
class Scored:
    group: ScoredGroup
    clamped: bool
    """Its version was from a lost branch, beyond the learner's own (counted as fresh)."""
    claim_mismatches: int
    """Completions whose claimed reward differs from the verifier's."""


def score_group(g: RolloutGroup, route: Route, task: Task, tok, version: int) -> Scored:
    """`g`, checked and routed, at the learner's `version`."""
    problem = task.get(g.prompt_id)
    rewards = [task.reward(c.text, problem.answer) for c in g.completions]
    prompt_ids = tok(g.prompt, add_special_tokens=False)["input_ids"]
    if route is Route.FOREIGN_SEQ:
        # the same event on both sides: the text, plus its end only where the generator ended it
        # (a completion cut by length has no EOS, and g's log-prob does not include one)
        comps = [Completion(tok(c.text, add_special_tokens=False)["input_ids"]
                            + ([tok.eos_token_id] if c.finish_reason == "stop" else []),
                            c.text, [], c.finish_reason) for c in g.completions]
        seq_logp = [sum(c.logprobs) for c in g.completions]
    else:
        comps = [Completion(c.token_ids, c.text, c.logprobs, c.finish_reason) for c in g.completions]
        seq_logp = None
    own = route is Route.OWN
    at = g.version if own else 0  # a partner's version numbers its own chain: meaningless here
    # made by weights of this learner's previous run (it resumed from an older checkpoint): the
    # rollout is sound, its version number is from a lost branch; count it as fresh
    clamped = own and at > version
    scored = ScoredGroup(g.prompt_id, prompt_ids, comps, rewards, g.model_id, version if clamped else at, seq_logp)
    return Scored(scored, clamped, sum(c.reward != r for c, r in zip(g.completions, rewards)))
