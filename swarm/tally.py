"""Contribution tallies: what each learner credits each sampler with, as signed DHT records.

Only learners credit work, and only work they trained on (the record passed every check, its
reward was recomputed, it was not dropped as too stale). A learner publishes its cumulative
per-sampler tally under `hetero_<swarm>_tallies`, subkey = its own `[owner:<public key>]`, so:
  - hivemind's RSASignatureValidator refuses a tally not signed by the subkey's key (a forged or
    edited tally, or one written under another learner's subkey);
  - `ownership.OwnerValidator` (run by every peer) refuses a tally whose `learner` field is not
    the peer id of that key, or that credits the learner itself;
  - `SwarmSchema` (dht.py) refuses malformed values.
Tallies are cumulative and carry a sequence number, so a replayed older tally can never add
credit: readers keep the newest per learner and count older ones as replays (leaderboard.py).
"""

from __future__ import annotations

from typing import Dict, List

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


class TallyModel(pydantic.BaseModel):
    learner: pydantic.StrictStr
    seq: pydantic.conint(ge=0, strict=True)
    """Increases with every publication: a reader refuses anything older than what it has."""
    time: pydantic.StrictFloat
    model_id: pydantic.StrictStr
    peers: Dict[pydantic.StrictStr, ContributionModel]


def tallies_key(swarm: str) -> str:
    return f"hetero_{swarm}_tallies"
