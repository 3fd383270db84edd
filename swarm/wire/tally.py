"""Contribution tallies: what each learner credits each sampler with, as signed DHT records.

Only learners credit work, and only work they trained on (the record passed every check, its
reward was recomputed, it was not dropped as too stale). A learner publishes its cumulative
per-sampler tally (the peers it credited most and last, by name; the rest as one aggregate,
`others`) at its own key `hetero_<swarm>_tally/<its peer id>`, subkey = its own
`[owner:<public key>]`, so:
  - hivemind's RSASignatureValidator refuses a tally not signed by the subkey's key (a forged or
    edited tally, or one written under another learner's subkey);
  - `ownership.OwnerValidator` (run by every peer) refuses a tally whose `learner` field is not
    the peer id of that key, or that credits the learner itself;
  - the same validator refuses malformed values (`TallyModel`), one over 1 MiB, and one under
    another learner's key;
  - readers (its samplers, the leaderboard) read the tallies of the learners they know, one key
    each: a tally of a key nobody named is never read.
Tallies are cumulative and carry a sequence number, so a replayed older tally can never add
credit: readers keep the newest per learner and count older ones as replays (leaderboard.py).

A tally also says how the learner is doing, so the leaderboard can show whether the swarm learns:
its model `version` and its latest held-out `eval_acc` with the `eval_version` that eval measured.
These are the learner's own claims, signed like the rest: the signature proves who claims them, not
that they are true (a coordinator that distrusts a learner leaves it out with --trusted-learner).
They are optional, since tallies from before them carry none, and bounded (versions >= 0,
0 <= eval_acc <= 1, an eval no newer than the version, eval_acc and eval_version together).

Compatibility: hivemind's SchemaValidator accepts a value only if parsing it gives it back
unchanged. So an optional field the sender left out must stay out of the parsed value
(`TallyModel.dict`), or every older tally would be refused; and a peer whose schema predates a field
drops it when parsing, so it refuses tallies that carry it (older peers refuse newer learners' tallies).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pydantic.v1 as pydantic


class ContributionModel(pydantic.BaseModel):
    groups: pydantic.conint(ge=0, strict=True)
    rollouts: pydantic.conint(ge=0, strict=True)
    """Completions trained on (a group holds G of them)."""
    tokens: pydantic.conint(ge=0, strict=True)
    """Completion tokens trained on."""
    first: pydantic.StrictFloat
    last: pydantic.StrictFloat
    """Unix time of the first and last credited group."""
    models: List[pydantic.StrictStr]


class OthersModel(pydantic.BaseModel):
    """The peers a tally does not name, together (node/learner/credit.py: a tally names at most 2,048, so
    it fits the DHT's 1 MiB bound whatever the number of keys credited)."""
    count: pydantic.conint(ge=0, strict=True)
    """How many peers."""
    groups: pydantic.conint(ge=0, strict=True)
    rollouts: pydantic.conint(ge=0, strict=True)
    tokens: pydantic.conint(ge=0, strict=True)


class TallyModel(pydantic.BaseModel):
    learner: pydantic.StrictStr
    seq: pydantic.conint(ge=0, strict=True)
    """Increases with every publication: a reader refuses anything older than what it has."""
    time: pydantic.StrictFloat
    model_id: pydantic.StrictStr
    peers: Dict[pydantic.StrictStr, ContributionModel]
    version: Optional[pydantic.conint(ge=0, strict=True)] = None
    """The learner's model version when it published."""
    eval_acc: Optional[pydantic.confloat(ge=0.0, le=1.0, strict=True)] = None
    """Its latest held-out eval accuracy, a fraction (NaN fails both bounds)."""
    eval_version: Optional[pydantic.conint(ge=0, strict=True)] = None
    """The version that eval measured."""
    others: Optional[OthersModel] = None
    """What it credited the peers it does not name with, together (absent: it names them all)."""

    @pydantic.root_validator(skip_on_failure=True)
    def _eval_is_whole(cls, values: Dict[str, Any]) -> Dict[str, Any]:
        acc, at, version = values.get("eval_acc"), values.get("eval_version"), values.get("version")
        if (acc is None) != (at is None):
            raise ValueError("eval_acc and eval_version come together")
        if at is not None and (version is None or at > version):
            raise ValueError(f"an eval at version {at} needs a current version at least as new (got {version})")
        return values

    def dict(self, **kwargs: Any) -> Dict[str, Any]:  # type: ignore[override]
        # what the sender left out stays out, so an older tally parses back to itself (module docstring)
        out = super().dict(**kwargs)
        for name in _OPTIONAL:
            if name not in self.__fields_set__:
                out.pop(name, None)
        return out


_OPTIONAL = ("version", "eval_acc", "eval_version", "others")

