"""A checked record made trainable: rewards recomputed by the task's verifier (the sampler's claim
is only compared), the prompt tokenized, and a foreign tokenizer's completions re-tokenized.

The verifier runs on a peer's text, so its time is bounded: a dataset task's reward (math-verify, or
a user's `package.module:function`) runs in a worker process within the group's budget
(node/tasks/bounded.py); past it, or refused by the reward's pre-check, `score_group` raises
`OverBudget` and the learner drops the group (`REWARD_BUDGET`)."""

from __future__ import annotations

from dataclasses import dataclass

from swarm.wire.rollout import RolloutGroup

from node.engines.base import Completion
from node.tasks import Task
from node.tasks.bounded import OverBudget, rewards as bounded_rewards
from node.training.batch import ScoredGroup
from node.learner.groups import Route
from swarm.wire.reasons import Drop

__all__ = ["OverBudget", "REWARD_BUDGET", "Scored", "score_group"]

REWARD_BUDGET = Drop.REWARD_BUDGET
"""The drop reason of a group whose rewards would cost more than its budget (node/tasks/bounded.py)."""


@dataclass(frozen=True)
class Scored:
    group: ScoredGroup
    clamped: bool
    """Its version was from a lost branch, beyond the learner's own (counted as fresh)."""
    claim_mismatches: int
    """Completions whose claimed reward differs from the verifier's."""


def score_group(g: RolloutGroup, route: Route, task: Task, tok, version: int) -> Scored:
    """`g`, checked and routed, at the learner's `version`; OverBudget if its rewards would cost more
    than its budget (nothing else is done then)."""
    problem = task.get(g.prompt_id)
    rewards = bounded_rewards(task, [c.text for c in g.completions], problem.answer)
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
