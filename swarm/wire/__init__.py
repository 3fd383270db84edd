"""Every record and message that crosses the wire or the seam: one typed struct each, with its
encode, decode and bounds in one place, and the direction it travels.

    rollout.py   RolloutGroup, CompletionRecord      sampler -> learner (signed, in a batch)
    batch.py     hetero.rollouts.v2: the batch, RolloutReply   sampler -> learner, and back
    envelope.py  Envelope: a record, its signer's key, the signature    any signer -> any reader
    manifest.py  hetero.manifest.v3: ManifestRequest, Manifest    sampler -> learner, and back
    chunks.py    hetero.chunks.v2: ChunkRequest (and how a blob is cut)    fetcher -> any holder
    reach.py     hetero.reach.v1: ReachRequest, ReachReply    a joining node -> a bootstrap, and back
    peer.py      PeerInfo, Holder, SwarmRecord    any peer -> the DHT
    tally.py     Tally    learner -> the DHT (read by its samplers and the leaderboard)
    directory.py hetero.directory.v1: DirectoryRequest, DirectoryReply, Entry, Want
                 any node -> a coordinator or a named learner (the DHT's records, sealed), and back
    text.py      printable, PeerTextFilter: a peer's text made terminal-safe    any peer -> a terminal or log

The DHT's records and the small messages are msgspec Structs (typed decoding straight from
msgpack). The rollout record and the batch keep their hand-written decoders: their bounds
(unknown fields within `MAX_UNKNOWN_BYTES`, list lengths checked from msgpack's headers before
anything is unpacked) have no msgspec counterpart, and msgspec decoded a record no faster (1.1x:
most of the time is the token and log-prob arrays). This package imports nothing of swarm/ but
`swarm.identity` (keys), so every other part of swarm/, and node/, may import it.
"""

import msgspec as _msgspec

MAX_MESSAGE = 3 * 1024 * 1024
"""One message at most: hivemind caps an RPC reply at 4 MiB, so ours stay under this."""


def decode_message(decoder: _msgspec.msgpack.Decoder, data: bytes, limit: int, what: str):
    """A peer's message of at most `limit` bytes, decoded by `decoder`; ValueError (and nothing
    else: garbage, a wrong type, nesting deep enough to recurse) if it is not one."""
    if len(data) > limit:
        raise ValueError(f"{what} of {len(data)} bytes (at most {limit})")
    try:
        return decoder.decode(data)
    except (_msgspec.DecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"not {what}: {e}") from None
