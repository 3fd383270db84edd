"""The learner role: check rollout records, buffer, audit, train, publish versions.

    config.py      LearnerConfig, the `[learner]` table
    learner.py     Learner: composes the parts below; the rollout receiver's `Intake`
    intake.py      RecordChecks (is a record work we can take?) and Chains (our version chains)
    scoring.py     a checked record made trainable: rewards recomputed, re-tokenized if foreign
    scoring_time.py  how much of the training thread each peer's text may take to score
    groups.py      BufferedGroup and the closed sets Route, GroupKind, Verdict
    buffer.py      GroupBuffer: accepted groups until trained on; which ones a step takes
    behaviour.py   Recompute: the learner's own behaviour log-probs where claims sit far
    books.py       Books: drops, throttles, trained-on counts (counted from the network thread too)
    credit.py      Tally: credit per sampler, and the signed tally it publishes
    checkpoint.py  checkpoints on disk, their metadata (RNG states, older formats), when to write
    evaluate.py    eval accuracy on held-out problems
    report.py      what a step record says of the learner

Its other parts live where their concept does: the Auditor in node/audit/, Training in
node/training/, Publishing in node/weights/.
"""

import importlib

_EXPORTS = {"GroupBuffer": "buffer", "pick_groups": "buffer", "DROP": "config", "LearnerConfig": "config",
            "BufferedGroup": "groups", "GroupKind": "groups", "Route": "groups", "Verdict": "groups",
            "Learner": "learner"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # each part loaded when first asked for: the config imports node.algorithms, so torch (1.5 s), and
    # the composite imports its parts (node/audit, node/training, node/weights), which import the
    # learner's config and groups from here; a reader of phases.py alone (the demo's summary) needs none
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"node.learner.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'node.learner' has no attribute {name!r}")
