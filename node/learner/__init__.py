"""The learner role: check rollout records, buffer, audit, train, publish versions.

    config.py      LearnerConfig, the `[learner]` table
    learner.py     Learner: composes the parts below; the rollout receiver's `Intake`
    checks.py      RecordChecks (is a record work we can take?) and Chains (our version chains)
    scoring.py     a checked record made trainable: rewards recomputed, re-tokenized if foreign
    groups.py      BufferedGroup and the closed sets Route, GroupKind, Verdict
    buffer.py      GroupBuffer: accepted groups until trained on; which ones a step takes
    auditor.py     Auditor: spot audits, proven samplers, refusals
    training.py    Training: one step per route's loss, the divergence guard
    publishing.py  Publishing: versions out through the link, into the audit archive
    books.py       Books: drops, throttles, credit (counted from the network thread too)
    persist.py     checkpoint metadata: RNG states, older formats
"""

from node.learner.buffer import GroupBuffer, pick_groups
from node.learner.config import DROP, LearnerConfig
from node.learner.groups import BufferedGroup, GroupKind, Route, Verdict
from node.learner.learner import Learner

__all__ = ["DROP", "BufferedGroup", "GroupBuffer", "GroupKind", "Learner", "LearnerConfig", "Route", "Verdict",
           "pick_groups"]
