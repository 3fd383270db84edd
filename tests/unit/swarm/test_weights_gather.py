"""The chunk scheduler (`Gather`) against scripted sources, no network: a lying holder's chunks are
taken elsewhere, a stalling one is hedged and demoted, a chunk no source has fails the download,
and each chunk's sources come in their order (holders, its owner, the learner twice)."""

import collections
import threading
import time

import msgpack
import pytest

from swarm.p2p import Doors, StreamStalled
from swarm.wire.rollout import RecordError
from swarm.wire.chunks import CHUNK_SIZE
from swarm.weights import FetchConfig, WeightFetcher
from swarm.wire.manifest import VersionEntry
from swarm.wire.peer import Holder
from swarm.weights.gather import Gather, Source

BLOB = bytes(range(256)) * (CHUNK_SIZE // 256) * 3 + b"tail"  # 4 chunks
ENTRY = VersionEntry.of_blob(7, None, BLOB)
LEARNER = "learner"


class ScriptedNode:
    """A SwarmNode whose peers answer chunk requests as `serve[peer]` says."""

    peer_id, private = "me", False

    def __init__(self, serve: dict) -> None:
        self.serve, self.asked = serve, []
        self.released = threading.Event()
        self.doors = Doors()

    def add_stream_handler(self, name, handler, **kw) -> None:
        pass

    def call_stream(self, peer, name, payload, timeout, on_item, max_item, stall) -> int:
        chain, version, indices, wait = msgpack.unpackb(payload)
        self.asked.append((peer, tuple(indices), wait))
        how = self.serve[peer]
        if how == "stall":  # accepts, then nothing: abandoned at its stall bound (here: the test's end)
            self.released.wait(10)
            raise StreamStalled("nothing for a while")
        if how in ("first", "ends"):  # holds the first chunk it is asked (or none): its stream ends there
            served = indices[:1] if how == "first" else []
            for i in served:
                on_item(BLOB[i * CHUNK_SIZE : (i + 1) * CHUNK_SIZE])
            return len(served)
        for i in indices:
            chunk = BLOB[i * CHUNK_SIZE : (i + 1) * CHUNK_SIZE]
            on_item({"good": chunk, "lie": b"x" * len(chunk), "none": b""}[how])
        return len(indices)


def gather(serve: dict, holders=(), owners=None, cfg=FetchConfig(hedge_s=0.3)):
    node = ScriptedNode(serve)
    fetcher = WeightFetcher(node, lambda: LEARNER, cfg=cfg, parallel=2)
    owners = owners or [None] * len(ENTRY.chunks)
    return fetcher, node, Gather(fetcher, fetcher._pool, 2, "c", ENTRY, LEARNER, list(holders), owners)


def run(fetcher, node, g):
    try:
        return b"".join(g.run()[i] for i in range(len(ENTRY.chunks)))
    finally:
        node.released.set()
        fetcher.close()


def test_chunks_of_a_lying_holder_are_taken_from_the_learner_and_the_holder_demoted():
    fetcher, node, g = gather({"h": "lie", LEARNER: "good"}, holders=["h"])
    assert run(fetcher, node, g) == BLOB
    assert fetcher.stats["bad_chunks"] == 4 and fetcher.demoted["h"] == 1
    # every chunk from the learner (a hedge under load may fetch one twice: counted as a duplicate too)
    assert fetcher.stats["bytes_from_learner"] == len(BLOB) + fetcher.stats["bytes_duplicate"]
    assert fetcher.stats["bytes_from_holders"] == 0


def test_a_stalling_holder_is_hedged_after_hedge_s_and_demoted():
    fetcher, node, g = gather({"h": "stall", LEARNER: "good"}, holders=["h"])
    assert run(fetcher, node, g) == BLOB
    # its chunks were asked of the learner on a hedge, not after the stall bound ended its stream
    assert fetcher.stats["hedged_streams"] >= 1 and fetcher.stats["stalled_streams"] == 0
    assert fetcher.demoted["h"] == 1
    assert {peer for peer, _, _ in node.asked} == {"h", LEARNER}


@pytest.mark.parametrize("how", ["first", "ends"])
def test_a_stream_that_ends_short_hands_the_rest_to_their_next_source_at_once(how):
    # hetero.chunks.v1 ends a stream at the first chunk not held (a holder past its door, or that
    # lacks it, sends no chunk at all): what the stream did not deliver is asked of the next source
    # as soon as it ends, not after a hedge, and is no failure
    fetcher, node, g = gather({"h": how, LEARNER: "good"}, holders=["h"], cfg=FetchConfig(hedge_s=30.0))
    assert run(fetcher, node, g) == BLOB  # no hedge (30 s) waited for: `hedged_streams` below
    served = {"first": 2, "ends": 0}[how]  # two streams to the holder (`_split`): each ends after its first, or at once
    assert fetcher.stats["bytes_from_holders"] == served * CHUNK_SIZE
    assert fetcher.stats["chunks_not_held"] == 4 - served and fetcher.stats["hedged_streams"] == 0
    asked_learner = [i for peer, indices, _ in node.asked if peer == LEARNER for i in indices]
    assert len(asked_learner) == 4 - served  # the rest, once each
    assert fetcher.demoted["h"] == (how == "ends")  # one that served none of what it announced: demoted, as before


def test_a_chunk_no_source_delivers_fails_the_download_once_the_learner_was_asked_twice():
    fetcher, node, g = gather({LEARNER: "none"})
    with pytest.raises(RecordError, match="verified from no source") as e:
        run(fetcher, node, g)
    assert e.value.reason == "sizes"
    asked = collections.Counter(i for _, indices, _ in node.asked for i in indices)
    dead = [i for i in range(4) if f"{i}" in e.value.detail.split("]")[0]]
    assert dead and all(asked[i] == 2 for i in dead) and max(asked.values()) == 2, (dead, asked)


def test_each_chunk_asks_holders_then_its_owner_then_the_learner_twice():
    fetcher, node, g = gather({}, holders=["h1", "h2", "h3"], owners=["mate", "me", LEARNER, "h1"])
    try:
        w = fetcher.peer_wait
        assert g._plans[0] == [Source("h1", 0.0), Source("h2", 0.0), Source("mate", w)] + [Source(LEARNER, 0.0)] * 2
        assert g._plans[1] == [Source("h2", 0.0), Source("h3", 0.0)] + [Source(LEARNER, 0.0)] * 2  # we own it
        assert [s.peer for s in g._plans[3]] == ["h1", "h2", LEARNER, LEARNER]  # an owner that holds it: asked once
        fetcher.demote("h2", "test")
        assert [s.peer for s in Gather(fetcher, fetcher._pool, 2, "c", ENTRY, LEARNER, ["h1", "h2", "h3"],
                                       [None] * 4)._plans[0]] == ["h1", "h3", LEARNER, LEARNER]
    finally:
        fetcher.close()


def test_only_credited_mates_holder_records_are_read_and_asked():
    # issue 39: holder records cost a fresh key each; 2,000 of them stalled every sampler
    records = {p: Holder(peer_id=p, chain="c", versions=[7]) for p in ["S1", "K1", "S2", "K2", "me"]}
    records["K3"] = Holder(peer_id="K3", chain="other", versions=[7])
    asked = []

    class Holders(ScriptedNode):
        def holdings_of(self, peer_ids):  # one own key per peer: a stranger's record is never read
            asked.extend(peer_ids)
            return [records[p] for p in peer_ids if p in records]
    fetcher = WeightFetcher(Holders({}), lambda: LEARNER, mates=lambda: ["K1", "K2", "K3", "me"])
    try:
        order = fetcher._holders("c")[7]
    finally:
        fetcher.close()
    assert sorted(asked) == ["K1", "K2", "K3"]  # our mates, not ourselves
    assert sorted(order) == ["K1", "K2"]  # K3 holds another chain


def test_a_download_that_ends_short_resumes_from_the_chunks_it_verified():
    # at size a try can end short (the learner's budget for new keys spent, a source gone); before,
    # the next try began again from chunk 0, and a 311 MB keyframe never completed (the rehearsal)
    class HalfLearner(ScriptedNode):
        def call_stream(self, peer, name, payload, timeout, on_item, max_item, stall) -> int:
            chain, version, indices, wait = msgpack.unpackb(payload)
            self.asked.append((peer, tuple(indices), wait))
            served = [i for i in indices if i < 2 or self.serve[peer] == "good"]  # "busy" past chunk 1
            for i in served:
                on_item(BLOB[i * CHUNK_SIZE : (i + 1) * CHUNK_SIZE])
            return len(served)

    node = HalfLearner({LEARNER: "busy"})
    fetcher = WeightFetcher(node, lambda: LEARNER, cfg=FetchConfig(hedge_s=0.3), parallel=2)
    try:
        fetcher.store.begin("c", ENTRY.version)
        with pytest.raises(RecordError, match="verified from no source"):
            Gather(fetcher, fetcher._pool, 2, "c", ENTRY, LEARNER, [], [None] * 4).run()
        deadline = time.monotonic() + 5  # the try fails as soon as one chunk has no source left; streams
        while len(fetcher.store.verified("c", ENTRY.version)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # still in flight go on delivering into the store
        assert sorted(fetcher.store.verified("c", ENTRY.version)) == [0, 1]
        time.sleep(0.1)
        node.serve[LEARNER], node.asked = "good", []
        got = Gather(fetcher, fetcher._pool, 2, "c", ENTRY, LEARNER, [], [None] * 4).run()
        assert b"".join(got[i] for i in range(4)) == BLOB
        assert sorted(i for _, indices, _ in node.asked for i in indices) == [2, 3]  # only what was missing
        fetcher.store.retain([])  # a version the learner stopped listing: its partial chunks go too
        assert fetcher.store.verified("c", ENTRY.version) == {}
    finally:
        fetcher.close()
