"""The learner's side of the intake seam as a stand-in that checks nothing (`Learner`), and signed
rollout items as a sampler sends them (`make_item`): for tests that drive a real `RolloutReceiver`
(tests/unit/swarm/test_intake.py by hand; over real peers,
tests/integration/swarm/test_fanout_wire.py and test_gated_rpc.py)."""

from __future__ import annotations

import collections
import uuid

import msgpack

from swarm.identity import Identity
from swarm.wire.envelope import seal
from swarm.wire.rollout import CompletionRecord, RolloutGroup


def make_item(ident: Identity, pad: int = 0, **extra) -> list:
    comps = [CompletionRecord("2", [5, 1], [-0.25, -0.5], "stop", 1.0)] * 2
    g = RolloutGroup(id=uuid.uuid4().hex, swarm="s", task="t", prompt_id="p", prompt="1+1=", model_id="m",
                     tokenizer="tk", version=0, sampler=ident.peer_id, created=1.0, completions=comps)
    record = msgpack.unpackb(g.encode(), raw=False)
    if pad:
        record["padding"] = b"\x00" * pad
    record.update(extra)
    return [g.id, seal(ident, msgpack.packb(record, use_bin_type=True))]


class Learner:
    """The learner's side of the intake seam (swarm.exchange.Intake): it checks nothing, has trained
    on nothing, proves the keys in `proven` (every key if None), refuses those in `refused`, and
    counts what the receiver tells it."""

    def __init__(self, proven: set[str] | None = None, refused: set[str] = frozenset()) -> None:
        self.proven, self.refused = proven, set(refused)
        self.rejected: collections.Counter[str] = collections.Counter()
        self.throttled: collections.Counter[str] = collections.Counter()

    def check(self, group: RolloutGroup) -> str | None:
        return None

    def untrained(self, sampler: str) -> int:
        return 0

    def is_proven(self, peer: str) -> bool:
        return self.proven is None or peer in self.proven

    def is_refused(self, peer: str) -> bool:
        return peer in self.refused

    def count_rejected(self, reason: str, n: int = 1) -> None:
        self.rejected[reason] += n

    def count_busy(self, why: str, n: int = 1) -> None:
        self.throttled[why] += n
