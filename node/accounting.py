"""Credit per sampler, kept by the learner: the groups it trained on, and their rollouts and tokens.

Only work the learner trained on is credited (the record passed every check, its reward was
recomputed, it was not dropped as stale). The learner publishes `record()` as its signed tally in
the DHT (swarm/tally.py validates it there), where the leaderboard reads it. The tally also
carries the learner's version and latest eval accuracy, so the leaderboard shows whether it learns.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass
class Tally:
    """A learner's running credit per sampler (kept in its checkpoints)."""

    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    seq: int = 0

    def credit(self, sampler: str, rollouts: int, tokens: int, model_id: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        c = self.peers.setdefault(sampler, {"groups": 0, "rollouts": 0, "tokens": 0, "first": now, "last": now,
                                            "models": []})
        c["groups"] += 1
        c["rollouts"] += int(rollouts)
        c["tokens"] += int(tokens)
        c["last"] = now
        if model_id not in c["models"]:
            c["models"].append(model_id)

    def revoke(self, sampler: str) -> None:
        """Take back all of `sampler`'s credit (it failed an audit); the next record omits it."""
        self.peers.pop(sampler, None)

    def record(self, learner: str, model_id: str, version: int | None = None,
               history: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        """The tally to publish. With `version` (the learner's now), it also carries the latest eval
        record in `history` (the learner's records, kind "eval" with "eval_acc" and "version")."""
        # milliseconds, so that it still grows after a restart from an older checkpoint
        self.seq = max(self.seq + 1, int(time.time() * 1000))
        out = {"learner": learner, "seq": self.seq, "time": float(time.time()), "model_id": model_id,
               "peers": {p: {**c, "first": float(c["first"]), "last": float(c["last"]), "models": list(c["models"])}
                         for p, c in self.peers.items() if p != learner}}
        if version is not None:
            out["version"] = int(version)
            ev = latest_eval(history)
            if ev is not None:  # plain int and float: the strict schema refuses numpy integers
                out.update(eval_acc=float(ev["eval_acc"]), eval_version=int(ev["version"]))
        return out


def latest_eval(history: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest record of kind "eval" in a learner's history, if any."""
    return next((r for r in reversed(history) if r.get("kind") == "eval"), None)
