"""Weight versions over the swarm: a signed manifest and hash-checked chunks served by every holder.

Learner side (`WeightServer`, server.py) serves two RPCs:
  hetero.manifest.v3  b"" or [chain, version, wait, notice, relay] (what the asker holds, and a long poll: answered
                      once the learner has a version newer than that one, or after `wait` s)
                      -> b"" when nothing is newer, else the manifest of the learner's current
                      chain segment (its last keyframe and the deltas after it; only those after
                      the asker's version when that is one of the 8 before the newest: server.py
                      `Segment`), sealed by the learner:
                      chain id, model, the segment's first version, and per version listed its
                      base, size and per-chunk sha256 (manifest.py: `Manifest`).
  hetero.chunks.v2    [chain, version, [index, ...], wait] -> a stream of those chunks, ending at
                      the first one not held. Served by the learner *and* by every sampler for
                      the versions it holds (announced in the DHT) or is downloading, so the
                      learner's upload need not grow with the number of samplers (chunks.py:
                      `ChunkStore`, `chunk_owner`).
                      A tail may come as a notice naming the samplers it went to (its relays).
Sampler side (`WeightFetcher`, fetcher.py): reads the manifest of the learner it follows (refusing
one that learner did not seal; a tail its notice names, from a relay: relay.py `TailRelay`, which
also serves the tails this sampler was sent over hetero.tail.v1 [chain, version, after, sha256] ->
the sealed tail or b""), plans which versions to fetch (`exchange.plan_fetch`), gathers
chunks from holders, mates and the learner (gather.py: `Gather`), and checks every chunk and the
whole blob's size against the manifest (a stream can silently lose its tail, so nothing is trusted
unverified). No source can hold a fetch hostage (config.py: `FetchConfig`): each item is bounded in
time and rate, a stream that stalls is hedged to the chunk's next source (the learner last), and a
source that stalls or lies is demoted with backoff (strikes.py: `PeerStrikes`). `WeightPrefetcher`
(prefetcher.py) fetches apart from generation. Weight loads follow the same injected-delay model as
the simulator (`ReloadTimer`).
"""

from swarm.weights.chunks import ChunkStore, chunk_owner
from swarm.weights.config import FetchConfig
from swarm.weights.fetcher import WeightFetcher
from swarm.weights.prefetcher import WeightPrefetcher
from swarm.weights.server import WeightServer
from swarm.weights.strikes import PeerStrikes

__all__ = ["ChunkStore", "chunk_owner", "FetchConfig", "WeightFetcher", "WeightPrefetcher", "WeightServer", "PeerStrikes"]
