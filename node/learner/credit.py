"""Credit per sampler, kept by the learner: the groups it trained on, and their rollouts and tokens.

Only work the learner trained on is credited (the record passed every check, its reward was
recomputed, it was not dropped as stale). The learner publishes `tally()`, a `swarm.wire.tally.Tally`,
as its signed record in the DHT (every peer's validator decodes it there), where its samplers and
the leaderboard read it. The tally also
carries the learner's version and latest eval accuracy, so the leaderboard shows whether it learns.

Keys are free, so nothing here grows with their number: the learner remembers at most `MAX_KEPT`
samplers (the least recently credited are folded into one aggregate, `forgotten`), and a published
tally names at most `MAX_PUBLISHED` of them, always under the DHT's bound for tallies; the rest are
one aggregate, `others` (`swarm.wire.tally.Others`).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from msgspec import UNSET

from swarm.wire.tally import MAX_SEEDERS, TALLY_BYTES, Contribution, Others, Tally
from node.metrics import Kind, Metric

ENTRY_BYTES = 256
"""A published peer entry at most, in msgpack, budgeted: ~141 bytes measured (a 46-character peer
id, six fields with large counts, one 26-character model id), ~250 with a 110-character model id."""
MAX_PUBLISHED = TALLY_BYTES // (2 * ENTRY_BYTES)
"""Peers a published tally names (2,048): half the byte bound at `ENTRY_BYTES` each, the other half
headroom (longer model ids, several models a peer). `tally()` still measures what it packs and
names fewer if that is over the bound, so a tally always fits."""
PUBLISHED_RECENT = 256
"""Of those, the most recently credited (the rest: the most credited by rollouts). Samplers read
the records of the 128 peers a tally credited last (`2 * MAX_MATES`, swarm/discovery.py
`most_recent`), so a newcomer becomes a mate even after thousands of long-gone samplers earned more."""
MAX_KEPT = 32_768
"""Samplers the learner remembers one by one (in memory and in its checkpoints' state.json): ~530
bytes an entry in memory (measured), ~195 in JSON, so ~17 MB and ~6.3 MB at most. Past it the least
recently credited is folded into `forgotten` (a count and sums: its credit still counts in the
totals, but can no longer be published by name or revoked)."""

_ZERO = {"count": 0, "groups": 0, "rollouts": 0, "tokens": 0}


def _fold(into: dict[str, int], c: dict[str, Any]) -> None:
    into["count"] += 1
    for k in ("groups", "rollouts", "tokens"):
        into[k] += int(c[k])


@dataclass
class Credit:
    """A learner's running credit per sampler (kept in its checkpoints), least recently credited first."""

    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    seq: int = 0
    forgotten: dict[str, int] = field(default_factory=lambda: dict(_ZERO))
    """The samplers past `MAX_KEPT`, least recently credited, in one aggregate (`count`, `groups`,
    `rollouts`, `tokens`)."""

    def __post_init__(self) -> None:
        self.forgotten = {**_ZERO, **self.forgotten}
        self._trim()  # a checkpoint from before the bound

    def credit(self, sampler: str, rollouts: int, tokens: int, model_id: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        c = self.peers.pop(sampler, None)  # re-inserted last: the dict's order is recency of credit
        if c is None:
            c = {"groups": 0, "rollouts": 0, "tokens": 0, "first": now, "last": now, "models": []}
        self.peers[sampler] = c
        c["groups"] += 1
        c["rollouts"] += int(rollouts)
        c["tokens"] += int(tokens)
        c["last"] = now
        if model_id not in c["models"]:
            c["models"].append(model_id)
        self._trim()

    def _trim(self) -> None:
        while len(self.peers) > MAX_KEPT:
            _fold(self.forgotten, self.peers.pop(next(iter(self.peers))))

    def revoke(self, sampler: str) -> None:
        """Take back all of `sampler`'s credit (it failed an audit); the next tally omits it."""
        self.peers.pop(sampler, None)

    def tally(self, learner: str, model_id: str, version: int | None = None,
              history: Sequence[dict[str, Any]] = (), seeders: Sequence[str] = ()) -> Tally:
        """The tally to publish, under `TALLY_BYTES`: the `PUBLISHED_RECENT` peers credited last, the
        most credited of the rest up to `MAX_PUBLISHED`, and `others` (count and sums) for everyone
        else, `forgotten` included (left out when empty, so a small swarm's tally is what peers whose
        schema predates `others` accept). With `version` (the learner's now), it also carries the
        latest eval record in `history` (the learner's records, kind "eval" with "eval_acc" and "version").
        `seeders`: peers the learner's chunk store served a version whole to (`ChunkStore.seeders`);
        those it has not credited are named, a new swarm's stand-in mates (swarm/discovery.py `earned`)."""
        # milliseconds, so that it still grows after a restart from an older checkpoint
        self.seq = max(self.seq + 1, int(time.time() * 1000))
        head: dict[str, Any] = {}
        if version is not None:
            head["version"] = int(version)
            ev = latest_eval(history)
            if ev is not None:
                head.update(eval_acc=float(ev[Metric.EVAL_ACC]), eval_version=int(ev[Metric.VERSION]))
        uncredited = [p for p in seeders if p not in self.peers and p != learner][:MAX_SEEDERS]
        if uncredited:
            head["seeders"] = uncredited
        candidates = [p for p in self.peers if p != learner]  # least recently credited first
        n = MAX_PUBLISHED
        while True:
            named = self._named(candidates, n)
            others = dict(self.forgotten)
            for p in candidates:
                if p not in named:
                    _fold(others, self.peers[p])
            tally = Tally(learner=learner, seq=self.seq, time=float(time.time()), model_id=model_id,
                          peers={p: _entry(self.peers[p]) for p in candidates if p in named},
                          others=Others(**others) if others["count"] else UNSET, **head)
            if n == 0 or len(tally.encode()) <= TALLY_BYTES:
                return tally
            n //= 2  # entries far over their budget (long model ids): name fewer

    def _named(self, candidates: list[str], n: int) -> set[str]:
        recent = candidates[max(0, len(candidates) - min(n, PUBLISHED_RECENT)):] if n else []
        rest = candidates[:len(candidates) - len(recent)]
        top = heapq.nlargest(n - len(recent), rest, key=lambda p: (self.peers[p]["rollouts"], p))
        return set(recent) | set(top)


def _entry(c: dict[str, Any]) -> Contribution:
    return Contribution(groups=int(c["groups"]), rollouts=int(c["rollouts"]), tokens=int(c["tokens"]),
                        first=float(c["first"]), last=float(c["last"]), models=list(c["models"]))


def latest_eval(history: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest record of kind "eval" in a learner's history, if any."""
    return next((r for r in reversed(history) if r.get(Metric.KIND) == Kind.EVAL), None)
