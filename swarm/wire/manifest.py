"""The learner's manifest of its chain segment, and the (long-poll) request for it.

hetero.manifest.v3: b"" or [chain, version, wait, notice, relay] -> the manifest, sealed by the learner: chain id,
model, the segment's first version (its keyframe), and per version listed its base, size and
per-chunk sha256 (which pin every byte: a whole-blob hash on top would only cost the fetcher a pass
over it). It lists only the versions after the one the asker holds when that is one of the few
published just before the newest (a sampler keeping up gets one version's hashes, not the
segment's: 100 patches of 20 MiB in 80 chunks are 272 kB), else the whole segment
(swarm/weights/server.py `Segment`). On the wire a msgpack map with the fields below in
their order; a keyframe's base is -1; a chunk's sha256 is its 32 raw bytes (a msgpack bin8, 34
bytes). Unknown extra fields are ignored.

A tail goes from the learner to a few samplers it credits (the relays), and to the others a
`TailNotice` in its place (~0.5 kB: which relays hold it, and its sha256), which they take the tail
from over hetero.tail.v1 (`TailRequest`; the learner when none does). So the learner's upload of
tails stays at a few a version, not one per sampler: at 1,000 samplers 3.4 MB a version, the 0.16
copies of a 20 MiB patch that one tail each costs (swarm/weights/server.py `Segment`,
swarm/weights/relay.py).

v1 listed the whole segment in every reply, and had no `first`. v2 sent each sha256 in hex (a str8,
66 bytes): what a learner uploads to every sampler a version, at 1,000 samplers 0.29 copies of a
20 MiB patch a version, where raw digests are 0.16 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from typing import Callable, ClassVar

import msgpack

from swarm.wire.envelope import open_envelope, seal
from swarm.identity import Identity, short_id
from swarm.wire.rollout import MAX_ID, RecordError
from swarm.wire.chunks import DIGEST_BYTES, chunk_digest, split_blob
from swarm.wire.reasons import Drop

MANIFEST = "hetero.manifest.v3"
TAIL = "hetero.tail.v1"
KEYFRAME_BASE = -1
"""The base a keyframe has on the wire."""


def _field(d: dict, name: str, kind: type | tuple[type, ...]):
    value = d.get(name) if isinstance(d, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RecordError(Drop.SCHEMA, f"manifest field {name!r}: {type(value).__name__}")
    return value


@dataclass(frozen=True)
class VersionEntry:
    """One version the manifest lists: what it applies to and the sha256 of each of its chunks."""

    version: int
    base: int | None
    """The version it is a delta of; None for a keyframe."""
    size: int
    """Bytes of the whole blob: a stream can silently lose its tail, so the fetcher checks it."""
    chunks: tuple[str, ...]
    """sha256 (hex) of each chunk of the blob, in order (cut by `chunks.chunk_size(size)`); raw
    bytes on the wire."""

    @classmethod
    def of_blob(cls, version: int, base: int | None, blob: bytes) -> VersionEntry:
        return cls(version, base, len(blob), tuple(chunk_digest(c) for c in split_blob(blob)))

    def to_wire(self) -> dict:
        wire = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**wire, "base": KEYFRAME_BASE if self.base is None else self.base,
                "chunks": [bytes.fromhex(c) for c in self.chunks]}

    @classmethod
    def from_wire(cls, d: dict) -> VersionEntry:
        base = _field(d, "base", int)
        chunks = _field(d, "chunks", list)
        if not all(isinstance(c, bytes) and len(c) == DIGEST_BYTES for c in chunks):
            raise RecordError(Drop.SCHEMA, f"manifest chunk hashes must be {DIGEST_BYTES} raw bytes each")
        return cls(_field(d, "version", int), None if base < 0 else base, _field(d, "size", int),
                   tuple(c.hex() for c in chunks))


@dataclass(frozen=True)
class Manifest:
    """The learner's current chain segment (its last keyframe and the deltas after it), or its tail:
    the versions after the one the asker holds."""

    model_id: str
    chain: str
    chunk_size: int
    """The largest chunk (CHUNK_SIZE). Each version is cut by `chunks.chunk_size` of its size, which
    no field says: the field stays so that the record's encoding is unchanged, and no one reads it."""
    versions: tuple[VersionEntry, ...]
    learner: str
    """The peer id of the learner that published it."""
    time: float
    """When it was published (the learner's clock)."""
    first: int
    """The segment's first version (its keyframe): `versions` start there or list only a tail."""

    def segment(self) -> range:
        """The versions of the segment up to the newest listed, those before the listing included:
        what a sampler on this chain keeps (and serves to mates), the rest it prunes."""
        return range(self.first, self.versions[-1].version + 1 if self.versions else self.first)

    def encode(self) -> bytes:
        wire = {f.name: getattr(self, f.name) for f in fields(self)}
        return msgpack.packb({**wire, "versions": [v.to_wire() for v in self.versions]})

    @classmethod
    def decode(cls, record: bytes) -> Manifest:
        d = msgpack.unpackb(record, raw=False)
        kinds = {"model_id": str, "chain": str, "chunk_size": int, "versions": list, "learner": str, "time": (int, float),
                 "first": int}
        values = {name: _field(d, name, kind) for name, kind in kinds.items()}
        return cls(**{**values, "versions": tuple(VersionEntry.from_wire(v) for v in values["versions"])})

    def seal(self, identity: Identity) -> bytes:
        return seal(identity, self.encode())

    @classmethod
    def open(cls, sealed: bytes, learner: str, forged: Callable[[], None] = lambda: None) -> Manifest:
        """The manifest in `sealed`, refused (RecordError "signature", after calling `forged`) unless
        `learner` sealed it: a manifest names the chunks' hashes, so it is the whole trust in them."""
        record, signer = open_envelope(sealed)
        if signer != learner:
            forged()
            raise RecordError(Drop.SIGNATURE, f"manifest signed by {short_id(signer)}, not by the learner we follow")
        return cls.decode(record)


@dataclass(frozen=True)
class ManifestRequest:
    """What the asker holds, (chain, version), and a long poll: the manifest once the learner's
    newest version is no longer that one, waiting at most `wait` s (0: answered at once). b"" asks
    for the whole segment at once (a sampler that holds nothing). `notice`: a `TailNotice` will do
    in place of the tail (the asker has mates to take it from); `relay`: the asker serves the tails
    it is sent to others (hetero.tail.v1: it can be dialled)."""

    chain: str
    version: int
    wait: float
    notice: bool = False
    relay: bool = False
    MAX_BYTES: ClassVar[int] = 512

    def encode(self) -> bytes:
        return msgpack.packb([self.chain, self.version, self.wait, self.notice, self.relay])

    @classmethod
    def decode(cls, payload: bytes) -> ManifestRequest | None:
        """None for b"" (answer at once); raises ValueError (or msgpack's error) if malformed."""
        if not payload:
            return None
        if len(payload) > cls.MAX_BYTES:
            raise ValueError(f"{len(payload)} bytes")
        chain, version, wait, notice, relay = msgpack.unpackb(payload)
        if not (isinstance(chain, str) and type(version) is int and type(wait) in (int, float)
                and type(notice) is bool and type(relay) is bool):
            raise ValueError("not [chain, version, wait, notice, relay]")
        return cls(chain, version, wait, notice, relay)


def tail_digest(sealed: bytes) -> bytes:
    """What a `TailNotice` pins a sealed tail with: its sha256."""
    return hashlib.sha256(sealed).digest()


@dataclass(frozen=True)
class TailNotice:
    """The learner's answer, in place of a tail, to an asker that takes notices: the tail after
    `after` up to `version` is the sealed manifest whose sha256 is `digest`, and `relays` were sent
    it (samplers the learner credits that serve the tails they are sent, hetero.tail.v1). Unsigned:
    it comes from the learner itself, over the connection its key authenticates, as b"" ("nothing
    newer") does; the tail it points to is sealed, and pinned by `digest`. On the wire a msgpack
    list [chain, version, after, digest, [relay, ...]], told from a sealed manifest (a map) by its
    first byte."""

    chain: str
    version: int
    after: int
    digest: bytes
    relays: tuple[str, ...]
    MAX_RELAYS: ClassVar[int] = 32

    def encode(self) -> bytes:
        return msgpack.packb([self.chain, self.version, self.after, self.digest, list(self.relays)])

    @staticmethod
    def is_notice(reply: bytes) -> bool:
        """Whether a manifest reply is a notice (a msgpack list) rather than a sealed manifest (a map)."""
        return bool(reply) and (0x90 <= reply[0] <= 0x9F or reply[0] in (0xDC, 0xDD))

    @classmethod
    def decode(cls, reply: bytes) -> TailNotice:
        """The notice in `reply`, or RecordError (schema) if it is not one within its bounds."""
        try:
            d = msgpack.unpackb(reply, raw=False, max_str_len=4 * MAX_ID, max_bin_len=DIGEST_BYTES,
                                max_array_len=max(5, cls.MAX_RELAYS), max_map_len=0, max_ext_len=0)
            chain, version, after, digest, relays = d
        except Exception as e:  # msgpack raises several types for garbage
            raise RecordError(Drop.SCHEMA, f"tail notice: {type(e).__name__}") from None
        if not (isinstance(chain, str) and type(version) is int and type(after) is int and isinstance(digest, bytes)
                and len(digest) == DIGEST_BYTES and isinstance(relays, list) and all(isinstance(r, str) for r in relays)):
            raise RecordError(Drop.SCHEMA, "not [chain, version, after, digest, [relay, ...]]")
        return cls(chain, version, after, digest, tuple(relays))


@dataclass(frozen=True)
class TailRequest:
    """hetero.tail.v1, to a relay: [chain, version, after, digest] -> the sealed tail with that
    sha256 if it holds one, else b""."""

    chain: str
    version: int
    after: int
    digest: bytes
    MAX_BYTES: ClassVar[int] = 512

    def encode(self) -> bytes:
        return msgpack.packb([self.chain, self.version, self.after, self.digest])

    @classmethod
    def decode(cls, payload: bytes) -> TailRequest:
        """Raises ValueError (or msgpack's error) if malformed."""
        if len(payload) > cls.MAX_BYTES:
            raise ValueError(f"{len(payload)} bytes")
        chain, version, after, digest = msgpack.unpackb(payload, raw=False)
        if not (isinstance(chain, str) and type(version) is int and type(after) is int and isinstance(digest, bytes)
                and len(digest) == DIGEST_BYTES):
            raise ValueError("not [chain, version, after, digest]")
        return cls(chain, version, after, digest)
