"""The learner's manifest of its chain segment, and the (long-poll) request for it.

hetero.manifest.v3: b"" or [chain, version, wait] -> the manifest, sealed by the learner: chain id,
model, the segment's first version (its keyframe), and per version listed its base, size and
per-chunk sha256 (which pin every byte: a whole-blob hash on top would only cost the fetcher a pass
over it). It lists only the versions after the one the asker holds when that is one of the few
published just before the newest (a sampler keeping up gets one version's hashes, not the
segment's: 100 patches of 20 MiB in 80 chunks are 272 kB), else the whole segment
(swarm/weights/server.py `Segment`). On the wire a msgpack map with the fields below in
their order; a keyframe's base is -1; a chunk's sha256 is its 32 raw bytes (a msgpack bin8, 34
bytes). Unknown extra fields are ignored.

v1 listed the whole segment in every reply, and had no `first`. v2 sent each sha256 in hex (a str8,
66 bytes): what a learner uploads to every sampler a version, at 1,000 samplers 0.29 copies of a
20 MiB patch a version, where raw digests are 0.16 (docs/BENCHMARKS.md).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, ClassVar

import msgpack

from swarm.wire.envelope import open_envelope, seal
from swarm.identity import Identity, short_id
from swarm.wire.rollout import RecordError
from swarm.wire.chunks import DIGEST_BYTES, chunk_digest, split_blob
from swarm.wire.reasons import Drop

MANIFEST = "hetero.manifest.v3"
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
    for the whole segment at once (a sampler that holds nothing)."""

    chain: str
    version: int
    wait: float
    MAX_BYTES: ClassVar[int] = 512

    def encode(self) -> bytes:
        return msgpack.packb([self.chain, self.version, self.wait])

    @classmethod
    def decode(cls, payload: bytes) -> ManifestRequest | None:
        """None for b"" (answer at once); raises ValueError (or msgpack's error) if malformed."""
        if not payload:
            return None
        if len(payload) > cls.MAX_BYTES:
            raise ValueError(f"{len(payload)} bytes")
        chain, version, wait = msgpack.unpackb(payload)
        if not isinstance(chain, str) or not isinstance(version, int) or not isinstance(wait, (int, float)):
            raise ValueError("not [chain, version, wait]")
        return cls(chain, version, wait)
