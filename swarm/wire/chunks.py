"""hetero.chunks.v2's request, and how a weight blob is cut into the chunks it names.

    request:  [chain, version, [index, ...], wait]   (`ChunkRequest`, at most MAX_REQUEST_BYTES)
    reply:    a stream of those chunks, in order, ending at the first one not held

Every chunk is pinned by its sha256 in the learner's signed manifest (manifest.py), so a holder
can serve only the right bytes or none.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgpack

from swarm.wire import MAX_MESSAGE
from swarm.wire.rollout import MAX_ID


CHUNKS = "hetero.chunks.v2"
"""v2: a version is cut by `chunk_size` (v1: in 1 MiB, whatever its size). The same index names other
bytes in the two, so they are two protocols: a v1 peer and a v2 peer exchange no chunk (an old
learner's chunks would be over a new fetcher's bound on an item, an old holder's wrong by hash)."""
CHUNK_SIZE = 1024 * 1024
"""The largest chunk: a version of at least CHUNKS_A_VERSION MiB is cut in these (`chunk_size`)."""
MIN_CHUNK = 64 * 1024
"""The smallest chunk, however small the version: below it, the work per chunk (a frame, a hash, a
request's index) would grow against its bytes for no gain in how fast a version spreads."""
CHUNKS_A_VERSION = 64
"""The fewest chunks a version of at least CHUNKS_A_VERSION x MIN_CHUNK (4 MiB) is cut in (`chunk_size`;
a smaller one is cut in MIN_CHUNK, a larger one than 64 MiB in CHUNK_SIZE). Why: a
mate forwards a chunk only once it holds it whole and verified, so a version spreads in about one
copy at the link rate plus the time an owner takes to forward its last chunk to its N - 1 mates,
(N - 1) x chunk / link, i.e. (N - 1) / chunks of the limit. A 20 MB patch (a 0.6B model's at lr
1e-6) in 1 MiB chunks is 20 of them: 8 mates at 25 Mbit/s were 1.5x the limit by that arithmetic
and 1.8-2.3x measured (docs/BENCHMARKS.md), and with more mates than chunks, an owner forwards a
whole MiB to each of its N - 1 mates. 64 chunks put 8 mates at ~1.1x and 64 mates at one chunk
each, while keeping the manifest small: a version under 64 MiB has at most 128 chunks, so a chain
segment of 100 such patches lists at most 12,800 chunk hashes (435 kB, against MAX_MESSAGE)."""
DIGEST_BYTES = 32
"""A chunk's sha256, as the manifest carries it (raw, not hex)."""
MANIFEST_BYTES_A_CHUNK = len(msgpack.packb(bytes(DIGEST_BYTES)))
"""34: what one chunk costs the manifest that lists it (its sha256, a msgpack bin8)."""
MAX_INDICES = MAX_MESSAGE // MANIFEST_BYTES_A_CHUNK
"""92,521: the most chunks a version can have, so the most indices a request may name, and one past
the largest index. A fetcher learns a version's chunks from its learner's manifest, one reply, which
our replies keep under MAX_MESSAGE (3 MiB; hivemind carries 4 MiB at most): no manifest lists more
chunks, so no version the code accepts is larger than 92,521 x CHUNK_SIZE (1 MiB) = 90.4 GiB (a 7B
keyframe in bf16: 14,306 chunks; a 32B one, about 61,000). An honest request names at most every chunk of
one version (`Gather._split`). (46.5 GiB while the manifest's hashes were hex, hetero.manifest.v2.)"""
MAX_REQUEST_WAIT = 10.0
"""The longest a peer may ask us to wait for one thing to answer with (a manifest newer than the one
it holds; a chunk still coming, counted from the last chunk we served on that request, so a request
is held at most this past its last chunk served: each one charged to the chunk door's bytes)."""


def chunk_digest(chunk: bytes | memoryview) -> str:
    """The sha256 the manifest pins a chunk with (hashlib lets go of the GIL: streams hash at once)."""
    return hashlib.sha256(chunk).hexdigest()


def chunk_size(total: int) -> int:
    """The size of the chunks a version of `total` bytes is cut in (its last one may be shorter):
    the largest power of two that cuts it in at least CHUNKS_A_VERSION, within [MIN_CHUNK,
    CHUNK_SIZE]. A function of the size the learner's signed manifest states, so the learner and
    every holder and fetcher cut a version alike without a field for it."""
    per = max(1, total // CHUNKS_A_VERSION)
    return min(CHUNK_SIZE, max(MIN_CHUNK, 1 << (per.bit_length() - 1)))


def split_blob(blob: bytes) -> list[bytes]:
    size = chunk_size(len(blob))
    return [blob[i : i + size] for i in range(0, len(blob), size)]


@dataclass(frozen=True)
class ChunkRequest:
    """[chain, version, [index, ...], wait]: those chunks of a version, each waited for at most
    `wait` s (capped at MAX_REQUEST_WAIT) if the holder is downloading it (`ChunkStore`)."""

    chain: str
    """Not checked: a chain the holder does not follow is simply not held (a stream of no chunk)."""
    version: int
    indices: list[int]
    wait: float

    def encode(self) -> bytes:
        return msgpack.packb([self.chain, self.version, self.indices, self.wait])

    @classmethod
    def decode(cls, payload: bytes) -> ChunkRequest:
        """The request in `payload`, or ChunkRequestError saying why not: `oversize` (over
        MAX_REQUEST_BYTES, before anything is unpacked), `too_many` (more than MAX_INDICES indices,
        told by msgpack from the list's header, before its items are unpacked), `undecodable`
        (not msgpack, trailing bytes, a string, list or map longer than a request has), `schema`."""
        if len(payload) > MAX_REQUEST_BYTES:
            raise ChunkRequestError("oversize", f"{len(payload)} bytes (at most {MAX_REQUEST_BYTES})")
        try:  # no string, list or map in a request is longer than these: msgpack checks before it allocates
            d = msgpack.unpackb(payload, raw=False, max_str_len=4 * MAX_ID, max_bin_len=0, max_array_len=MAX_INDICES,
                                max_map_len=0, max_ext_len=0)
        except Exception as e:  # msgpack raises several types for garbage
            reason = "too_many" if "max_array_len" in str(e) else "undecodable"
            raise ChunkRequestError(reason, f"{type(e).__name__}: {e}") from None
        if not (isinstance(d, list) and len(d) == 4):
            raise ChunkRequestError("schema", "not [chain, version, [index, ...], wait]")
        chain, version, indices, wait = d
        if not (isinstance(chain, str) and len(chain) <= MAX_ID and type(version) is int and isinstance(indices, list)
                and type(wait) in (int, float) and 0 <= wait):  # (a NaN is not >= 0)
            raise ChunkRequestError("schema", "not [chain, version, [index, ...], wait]")
        if not all(type(i) is int and 0 <= i < MAX_INDICES for i in indices):
            raise ChunkRequestError("schema", f"an index that is not an int in [0, {MAX_INDICES})")
        return cls(chain, version, indices, float(wait))


class ChunkRequestError(ValueError):
    """A chunk request no honest fetcher sends; `reason` is what it is counted as."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


MAX_REQUEST_BYTES = len(ChunkRequest("\U0010ffff" * MAX_ID, -(1 << 63), [MAX_INDICES - 1] * MAX_INDICES,
                                     MAX_REQUEST_WAIT).encode())
"""462,888: the largest request that follows the protocol (a chain of MAX_ID 4-byte characters, a
9-byte version, MAX_INDICES indices of up to 5 bytes each, a float wait). The request frame is bounded by
it before a byte of its payload is read (`BoundedStream`); the transport's own bound is MAX_MESSAGE."""
