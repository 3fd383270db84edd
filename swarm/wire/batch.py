"""The rollout protocol's bytes, both directions, in one place.

  hetero.rollouts.v2  request: [[record id, envelope], ...] (a msgpack list of at most MAX_BATCH items)
                      reply:   `RolloutReply`, a msgpack map {"ok", "rejected", "busy", "backlog"
                               [, "why"] [, "error"]}

A gated call (swarm/p2p/calls.py, `call_gated`): the sampler declares the batch's size, the
learner's door answers busy or go before reading a byte of it, and only then is the batch sent. (v1
was a unary call, whose payload p2pd reads whole before any check.)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import msgpack

from swarm.wire.rollout import MAX_ID, RecordError
from swarm.wire.reasons import Drop

ROLLOUTS = "hetero.rollouts.v2"
MAX_BATCH = 256


@dataclass(frozen=True)
class BatchItem:
    """One item of a batch as the learner sees it before opening anything."""

    id: str
    """The id the sender gave it ("?" if the item is not a list): replies name it so."""
    envelope: bytes | None
    """The signed envelope; None if the item is not shaped [id, envelope] (refused as `schema`)."""

    @classmethod
    def of(cls, item) -> BatchItem:
        """The item as the learner sees it; RecordError `batch_schema` (the whole batch refused) if
        it is a list whose id is not a str of 1..MAX_ID characters, a name the reply cannot give
        back (honest samplers send a uuid4's 32 hex digits; a record's id is at most MAX_ID). Only a
        str is ever taken as an id: an id nested 1,000 lists deep was rendered with str(), whose
        RecursionError escaped the receiver's refusal."""
        if not (isinstance(item, list) and item):
            return cls("?", None)
        rid = item[0]
        if not (isinstance(rid, str) and 0 < len(rid) <= MAX_ID):
            what = f"a str of {len(rid)} characters" if isinstance(rid, str) else type(rid).__name__
            raise RecordError(Drop.BATCH_SCHEMA, f"an item's id is {what}, not a str of 1..{MAX_ID} characters")
        shaped = len(item) == 2 and isinstance(item[1], bytes)
        return cls(rid, item[1] if shaped else None)

    @property
    def size(self) -> int:
        """The envelope's bytes, which bound its record's: what the byte bounds see before decoding."""
        return len(self.envelope) if self.envelope is not None else 0


POLL_BYTES = 1
"""An empty batch's bytes (msgpack's empty list): a sampler's poll for its backlog, which adds
nothing to any room at the learner (swarm/rollouts/admission.py lets it past full rooms)."""


def pack_batch(items: list[tuple[str, bytes]]) -> bytes:
    """A sender's batch of (record id, envelope)."""
    return msgpack.packb([[rid, envelope] for rid, envelope in items])


def unpack_batch(payload: bytes) -> list[BatchItem]:
    """A rollout batch's items, or RecordError: `batch_too_many` (told by the list's header, before
    anything is unpacked), `batch_undecodable` (not msgpack, truncated, trailing bytes) or
    `batch_schema` (msgpack, but not a list, or an item whose id is not a short str, or one that
    could not be read: never another exception, which would escape the receiver's refusal)."""
    n = _array_len(payload)
    if n is not None and n > MAX_BATCH:
        raise RecordError(Drop.BATCH_TOO_MANY, f"{n} items (at most {MAX_BATCH})")
    try:  # items are [id, envelope]: no list or map in a batch needs to be longer than a batch
        items = msgpack.unpackb(payload, raw=False, max_array_len=MAX_BATCH, max_map_len=MAX_BATCH)
    except Exception as e:  # msgpack raises several types for garbage
        raise RecordError(Drop.BATCH_UNDECODABLE, f"{type(e).__name__}: {e}") from None
    if not isinstance(items, list):
        raise RecordError(Drop.BATCH_SCHEMA, f"a batch is a list of [id, envelope] pairs, not {type(items).__name__}")
    try:
        return [BatchItem.of(item) for item in items]
    except RecordError:
        raise
    except Exception as e:  # nothing else is known to raise here; whatever may, the batch is refused with a reason
        raise RecordError(Drop.BATCH_SCHEMA, f"an item could not be read: {type(e).__name__}") from None


def _array_len(data: bytes) -> int | None:
    """The length a msgpack array header at the start of `data` claims, or None if there is none."""
    if data[:1] and 0x90 <= data[0] <= 0x9F:
        return data[0] & 0x0F
    if data[:1] == b"\xdc" and len(data) >= 3:
        return int.from_bytes(data[1:3], "big")
    if data[:1] == b"\xdd" and len(data) >= 5:
        return int.from_bytes(data[1:5], "big")
    return None


@dataclass(frozen=True)
class RolloutReply:
    """The learner's answer to one batch (or to a call its door turned away unread)."""

    ok: list[str] = field(default_factory=list)
    """Ids journaled: settled, the sampler drops them from its outbox."""
    rejected: dict[str, str] = field(default_factory=dict)
    """Id -> reason, refused for good: settled too."""
    busy: list[str] = field(default_factory=list)
    """Ids past a bound, not even decoded: the sampler keeps them and sends them later."""
    backlog: int = 0
    """This sampler's groups received but not yet trained on: it pauses while this is large."""
    why: str | None = None
    """The bound that made items busy, or the call unread (absent from the bytes when None)."""
    error: str | None = None
    """Why the batch itself was refused (absent from the bytes when None)."""

    def encode(self) -> bytes:
        # fields in declaration order: the map's keys come out as v2 always wrote them
        return msgpack.packb({f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None})

    @classmethod
    def decode(cls, data: bytes) -> RolloutReply:
        """A reply from a learner; missing keys take their defaults, unknown ones are ignored (a
        newer learner may add some). ValueError if it is no reply at all."""
        d = msgpack.unpackb(data, raw=False)
        if not isinstance(d, dict):
            raise ValueError(f"a rollout reply is a map, not {type(d).__name__}")
        reply = cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        if not (isinstance(reply.ok, list) and isinstance(reply.rejected, dict) and isinstance(reply.busy, list)):
            raise ValueError("a rollout reply's ok and busy are lists, its rejected a map")
        return replace(reply, backlog=int(reply.backlog))
