"""The chunk scheduler (`Gather`) against scripted sources, no network: a lying holder's chunks are
taken elsewhere, a silent one is hedged and demoted, a slow one still delivering is hedged and not
demoted, a chunk no source has fails the download, and each chunk's sources come in their order
(holders, its owner, other mates, the learner twice)."""

import collections
import threading
import time

import msgpack
import pytest

from helpers.wait import until
from swarm.p2p import Doors, StreamStalled
from swarm.wire.rollout import RecordError
from swarm.wire.chunks import CHUNK_SIZE, MIN_CHUNK, chunk_size
from swarm.weights import FetchConfig, WeightFetcher
from swarm.wire.manifest import VersionEntry
from swarm.wire.peer import Holder
from swarm.weights.gather import Gather, Source

PIECE = MIN_CHUNK
BLOB = bytes(range(256)) * (PIECE // 256) * 3 + b"tail"  # 4 chunks (of PIECE: a version this small is cut in the smallest)
assert chunk_size(len(BLOB)) == PIECE
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

    def add_handler(self, name, handler) -> None:
        pass

    def call_stream(self, peer, name, payload, timeout, on_item, max_item, stall) -> int:
        chain, version, indices, wait = msgpack.unpackb(payload)
        self.asked.append((peer, tuple(indices), wait))
        how = self.serve[peer]
        if how == "stall":  # accepts, then nothing: abandoned at its stall bound (here: the test's end)
            self.released.wait(10)
            raise StreamStalled("nothing for a while")
        if how in ("slow", "then_stall"):  # a congested mate: its first chunk now, the next after a pause
            on_item(BLOB[indices[0] * PIECE : (indices[0] + 1) * PIECE])
            if how == "then_stall":  # and then nothing: abandoned at its stall bound (here: when released)
                self.released.wait(10)
                raise StreamStalled("nothing after its first chunk")
            self.released.wait(SLOW_GAP)  # (or less, if the test is over)
            for i in indices[1:]:
                on_item(BLOB[i * PIECE : (i + 1) * PIECE])
            return len(indices)
        if how == "breaks":  # its first chunk, then the stream breaks (a reset, a peer gone)
            on_item(BLOB[indices[0] * PIECE : (indices[0] + 1) * PIECE])
            raise ConnectionResetError("the stream broke")
        if how in ("first", "ends"):  # holds the first chunk it is asked (or none): its stream ends there
            served = indices[:1] if how == "first" else []
            for i in served:
                on_item(BLOB[i * PIECE : (i + 1) * PIECE])
            return len(served)
        for i in indices:
            chunk = BLOB[i * PIECE : (i + 1) * PIECE]
            on_item({"good": chunk, "lie": b"x" * len(chunk), "none": b""}[how])
        return len(indices)


SLOW_GAP = 60.0
"""A slow source's pause after its first chunk on a stream: far past the tests' `hedge_s` (0.3 s),
so that what arrives before it ends came by a hedge on any CPU, however loaded (the pause ends
early when the test is over)."""


STEADY_HEDGE_S = 2.0
"""`hedge_s` for the tests that count exactly who was asked: a scripted source answers at once (in
microseconds), so a hedge past it is only the scripted slowness, unless a loaded CPU holds a pool
thread this long (0.3 s was near enough to be reached)."""


def gather(serve: dict, holders=(), owners=None, mates=(), cfg=FetchConfig(hedge_s=0.3), peer_wait=5.0):
    node = ScriptedNode(serve)
    fetcher = WeightFetcher(node, lambda: LEARNER, cfg=cfg, parallel=2, peer_wait=peer_wait)
    owners = owners or [None] * len(ENTRY.chunks)
    return fetcher, node, Gather(fetcher, fetcher._pool, 2, "c", ENTRY, LEARNER, list(holders), owners, list(mates))


def run(fetcher, node, g, arrived: list | None = None):
    """The gathered blob; `arrived` (if given) gets (index, source) of each chunk as the gather
    ended, before the scripted sources are released."""
    try:
        got = g.run()
        if arrived is not None:
            arrived += [(i, src) for _, i, src in g.arrived]
            # and the gather ended before any scripted stall gave up: by a hedge, not at its bound
            arrived.append(("stalled", fetcher.stats["stalled_streams"]))
        return b"".join(got[i] for i in range(len(ENTRY.chunks)))
    finally:
        node.released.set()
        fetcher.close()
        fetcher._pool.shutdown(wait=True)  # the streams' threads done: their counts are final


def test_chunks_of_a_lying_holder_are_taken_from_the_learner_and_the_holder_demoted():
    fetcher, node, g = gather({"h": "lie", LEARNER: "good"}, holders=["h"])
    assert run(fetcher, node, g) == BLOB
    assert fetcher.stats["bad_chunks"] == 4 and fetcher.demoted["h"] == 1
    # every chunk from the learner (a hedge under load may fetch one twice: counted as a duplicate too)
    assert fetcher.stats["bytes_from_learner"] == len(BLOB) + fetcher.stats["bytes_duplicate"]
    assert fetcher.stats["bytes_from_holders"] == 0
    assert sorted((i, src) for _, i, src in g.arrived) == [(i, LEARNER) for i in range(4)]  # each once, its source


@pytest.mark.parametrize("how", ["slow", "stall"])
@pytest.mark.parametrize("role", ["holder", "owner"])
def test_a_source_still_delivering_is_hedged_not_demoted_a_silent_one_is_demoted(role, how):
    # the emulated WAN: a public mate serves its half to every private one, seconds between its
    # chunks on one stream; demoted for it, its chunks went to the learner for 30 s and more
    source = {"holder": dict(holders=["s"]), "owner": dict(owners=["s"] * 4, mates=["s"])}[role]
    fetcher, node, g = gather({"s": how, LEARNER: "good"}, **source, peer_wait=0.2)
    arrived: list = []
    assert run(fetcher, node, g, arrived) == BLOB
    # the rest were asked of the learner on a hedge, not after the pause or the stall bound: all but
    # the slow source's first chunk came from the learner before the source's pause (SLOW_GAP) ended
    assert arrived.pop() == ("stalled", 0), arrived
    assert sum(src == "s" for _, src in arrived) <= (how == "slow"), arrived
    assert sorted(i for i, _ in arrived) == list(range(4)), arrived
    assert fetcher.stats["hedged_streams"] >= 1 and fetcher.stats["bytes_from_learner"] > 0, fetcher.stats
    assert {peer for peer, _, _ in node.asked} == {"s", LEARNER}
    assert fetcher.demoted["s"] == (how == "stall"), (fetcher.demoted, fetcher.stats)
    assert fetcher.stats["hedged_slow_streams"] == (fetcher.stats["hedged_streams"] if how == "slow" else 0)


def test_a_source_that_delivers_then_stops_is_demoted_when_its_stall_bound_ends_the_stream():
    # not demoted at the hedge (it delivered), but a stream that stops is abandoned at its stall
    # bound (`FetchConfig.stall`: StreamStalled), and that demotes it
    fetcher, node, g = gather({"s": "then_stall", LEARNER: "good"}, owners=["s"] * 4, mates=["s"], peer_wait=0.2)
    assert b"".join(g.run()[i] for i in range(4)) == BLOB
    try:
        assert fetcher.demoted["s"] == 0 and fetcher.stats["hedged_slow_streams"] >= 1, fetcher.stats
        node.released.set()  # here: the stall bound
        until(lambda: fetcher.demoted["s"], "the stalled source demoted")
        assert fetcher.demoted["s"] == 1 and fetcher.stats["stalled_streams"] >= 1, fetcher.stats
    finally:
        fetcher.close()


def test_a_hedge_goes_to_another_mate_before_the_learner():
    # a private sampler: chunk owners are its public mates; one congested, the other has the chunks
    fetcher, node, g = gather({"m1": "slow", "m2": "good", LEARNER: "good"}, owners=["m1"] * 4, mates=["m1", "m2"],
                              cfg=FetchConfig(hedge_s=STEADY_HEDGE_S), peer_wait=0.2)
    assert run(fetcher, node, g) == BLOB
    assert fetcher.stats["hedged_slow_streams"] >= 1 and fetcher.demoted["m1"] == 0, fetcher.stats
    assert fetcher.stats["bytes_from_learner"] == 0, fetcher.stats  # the learner was not asked
    assert {peer for peer, _, _ in node.asked} == {"m1", "m2"}
    assert {wait for peer, _, wait in node.asked if peer == "m2"} == {0.2}  # it may wait for a chunk still coming


def test_a_slow_stream_whose_chunks_all_came_from_its_hedge_stops_at_its_next_chunk():
    # a trickling source keeps a pool thread until its deadline otherwise (16 threads: a few
    # versions of it and downloads queue behind it); not demoted: slow is not faulty
    fetcher, node, g = gather({"m1": "slow", "m2": "good", LEARNER: "good"}, owners=["m1"] * 4, mates=["m1", "m2"],
                              peer_wait=0.2)
    try:
        assert b"".join(g.run()[i] for i in range(4)) == BLOB
        node.released.set()  # the slow source sends its next chunk now: the stream stops there
        until(lambda: fetcher.stats["superseded_streams"], "the superseded stream stopped")
        assert fetcher.stats["superseded_streams"] >= 1 and fetcher.demoted["m1"] == 0, fetcher.stats
        assert fetcher.stats["bytes_duplicate"] == 0, fetcher.stats  # the chunk it brought was not taken again
    finally:
        node.released.set()
        fetcher.close()


@pytest.mark.parametrize("how", ["first", "ends"])
def test_a_stream_that_ends_short_hands_the_rest_to_their_next_source_at_once(how):
    # hetero.chunks.v2 ends a stream at the first chunk not held (a holder past its door, or that
    # lacks it, sends no chunk at all): what the stream did not deliver is asked of the next source
    # as soon as it ends, not after a hedge, and is no failure
    fetcher, node, g = gather({"h": how, LEARNER: "good"}, holders=["h"], cfg=FetchConfig(hedge_s=30.0))
    assert run(fetcher, node, g) == BLOB  # no hedge (30 s) waited for: `hedged_streams` below
    served = {"first": 1, "ends": 0}[how]  # one stream to the holder (4 small chunks: `_split`): it ends after its first, or at once
    assert fetcher.stats["bytes_from_holders"] == served * PIECE
    assert fetcher.stats["chunks_not_held"] == 4 - served and fetcher.stats["hedged_streams"] == 0
    asked_learner = [i for peer, indices, _ in node.asked if peer == LEARNER for i in indices]
    assert len(asked_learner) == 4 - served  # the rest, once each
    assert fetcher.demoted["h"] == (how == "ends")  # one that served none of what it announced: demoted, as before


def test_a_stream_that_breaks_hands_the_rest_to_their_next_source_and_counts_them():
    fetcher, node, g = gather({"h": "breaks", LEARNER: "good"}, holders=["h"], cfg=FetchConfig(hedge_s=30.0))
    assert run(fetcher, node, g) == BLOB
    # one stream to the holder (4 small chunks: `_split`), broken after its first chunk: the other
    # three failed, asked of the learner once each (a broken stream may have lost what was in flight: counted)
    assert fetcher.stats["bytes_from_holders"] == PIECE and fetcher.stats["chunks_failed"] == 3
    assert sorted(i for peer, indices, _ in node.asked if peer == LEARNER for i in indices) == [1, 2, 3]
    assert sorted(src for _, _, src in g.arrived) == ["h", LEARNER, LEARNER, LEARNER]


def test_streams_to_one_source_go_by_bytes_asked_one_per_2_mib_up_to_parallel():
    fetcher, node, _ = gather({LEARNER: "good"})
    for size, n, streams in [(20 << 20, 10, 1),  # a 20 MB patch (256 KiB chunks): an owner's 10, 2.5 MiB
                             (20 << 20, 80, 4),  # all 80 of them: 20 MiB, capped at `parallel`
                             (64 << 20, 2, 1), (64 << 20, 4, 2), (64 << 20, 7, 3)]:  # 1 MiB chunks: one per 2
        entry = VersionEntry(7, None, size, ("0" * 64,) * -(-size // chunk_size(size)))
        g = Gather(fetcher, fetcher._pool, 4, "c", entry, LEARNER, [], [None] * len(entry.chunks), [])
        parts = g._split(list(range(n)))
        assert len(parts) == streams and sorted(i for p in parts for i in p) == list(range(n)), (size, n, parts)
    fetcher.close()


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
                                       [None] * 4, [])._plans[0]] == ["h1", "h3", LEARNER, LEARNER]
    finally:
        fetcher.close()


def test_each_chunk_asks_its_owner_then_other_mates_rotated_by_our_id_then_the_learner():
    mates, n, w = [f"m{k}" for k in range(6)], 32, 0.5
    entry = VersionEntry(7, None, n * CHUNK_SIZE, ("0" * 64,) * n)  # only the plans are looked at

    def plans(me: str, owners: list, holders=(), demoted=(), mates=mates) -> list[list[Source]]:
        node = ScriptedNode({})
        node.peer_id = me
        fetcher = WeightFetcher(node, lambda: LEARNER, cfg=FetchConfig(holder_tries=2), parallel=2, peer_wait=w)
        try:
            for peer in demoted:
                fetcher.demote(peer, "test")
            g = Gather(fetcher, fetcher._pool, 2, "c", entry, LEARNER, list(holders), owners, [*mates, me, LEARNER])
            return [g._plans[i] for i in range(n)]
        finally:
            fetcher.close()

    owners = [mates[i % 2] for i in range(n)]  # m0 and m1 own the chunks (the public mates of a private sampler)
    mine, firsts = plans("me", owners), collections.Counter()
    for i, plan in enumerate(mine):
        assert plan[0] == Source(owners[i], w) and plan[3:] == [Source(LEARNER, 0.0)] * 2, plan
        hedges = [s.peer for s in plan[1:3]]
        others = [m for m in mates if m != owners[i]]  # sorted; never us, the learner or the owner
        start = others.index(hedges[0])  # consecutive mates, from a start that our id and i pick
        assert hedges == (others * 2)[start : start + 2] and {s.wait for s in plan[1:3]} == {w}, (i, plan)
        firsts[hedges[0]] += 1
    assert len(firsts) >= 4, firsts  # hedges spread over the mates, not all on one
    assert plans("me", owners) == mine  # deterministic
    assert plans("you", owners) != mine  # and another sampler spreads its own way
    # a holder is asked as one, not again as a hedge; a demoted mate is not asked at all
    held = plans("me", owners, holders=["m3"], demoted=["m4"])
    assert all("m3" not in [s.peer for s in p[1:]] and "m4" not in [s.peer for s in p] for p in held), held
    assert all(len(p) == 6 for p in held), held  # m3; the owner; 2 hedges; the learner twice
    # a chunk we own, or with no mates: straight to the learner, no mate asked
    assert plans("me", ["me"] * n)[0] == [Source(LEARNER, 0.0)] * 2
    assert plans("me", [None] * n, mates=[])[0] == [Source(LEARNER, 0.0)] * 2


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
                on_item(BLOB[i * PIECE : (i + 1) * PIECE])
            return len(served)

    node = HalfLearner({LEARNER: "busy"})
    fetcher = WeightFetcher(node, lambda: LEARNER, cfg=FetchConfig(hedge_s=STEADY_HEDGE_S), parallel=2)
    try:
        fetcher.store.begin("c", ENTRY.version)
        with pytest.raises(RecordError, match="verified from no source"):
            Gather(fetcher, fetcher._pool, 2, "c", ENTRY, LEARNER, [], [None] * 4, []).run()
        # the try fails as soon as one chunk has no source left; streams still in flight go on delivering into the store
        until(lambda: len(fetcher.store.verified("c", ENTRY.version)) >= 2, "the streams in flight delivered")
        assert sorted(fetcher.store.verified("c", ENTRY.version)) == [0, 1]
        time.sleep(0.1)
        node.serve[LEARNER], node.asked = "good", []
        got = Gather(fetcher, fetcher._pool, 2, "c", ENTRY, LEARNER, [], [None] * 4, []).run()
        assert b"".join(got[i] for i in range(4)) == BLOB
        assert sorted(i for _, indices, _ in node.asked for i in indices) == [2, 3]  # only what was missing
        fetcher.store.retain([])  # a version the learner stopped listing: its partial chunks go too
        assert fetcher.store.verified("c", ENTRY.version) == {}
    finally:
        fetcher.close()


def test_a_stream_is_hedged_by_the_other_sources_pace_and_never_later_than_idle_s():
    fetcher, node, g = gather({"m1": "good", "m2": "good", LEARNER: "good"}, owners=["m1"] * 4, mates=["m1", "m2"])
    try:
        assert g._hedge_after("m1") == 0.3  # nothing measured, no earlier download: hedge_s
        g._gap("m2", 2.0)
        g._gap("m2", 2.0)
        # m2's streams bring a chunk every 2 s: m1 is hedged after 3 x 2 s, m2 by the others' pace
        # (none measured): its own slow gaps do not raise its own bar
        assert g._hedge_after("m1") == pytest.approx(6.0) and g._hedge_after("m2") == 0.3
        g._gap("m1", 100.0)  # however slow the others, at most idle_s
        assert g._hedge_after("m2") == FetchConfig().idle_s and g.pace == pytest.approx(104.0 / 3)
    finally:
        fetcher.close()
    fetcher, _, fresh = gather({"m1": "good", LEARNER: "good"})
    try:
        fetcher.pace = 1.0  # the last download's, until this one measures the others'
        assert fresh._hedge_after("m1") == pytest.approx(3.0)
    finally:
        fetcher.close()


def test_the_learners_streams_are_bounded_against_a_dead_learner_not_a_shared_uplink():
    cfg = FetchConfig()
    learner, mate = cfg.stall(0.0, learner=True), cfg.stall(10.0)
    # 10 Mbit/s shared by 128 streams: 9,765.6 B/s; an item may start one such chunk late
    assert learner.min_rate == pytest.approx(10e6 / 8 / 128)
    assert learner.idle_s == pytest.approx(10.0 + CHUNK_SIZE / (10e6 / 8 / 128))  # 117.4 s
    assert (mate.idle_s, mate.min_rate) == (20.0, 128 * 1024)


@pytest.mark.parametrize("seeding", [True, False])
def test_while_the_mates_are_seeders_a_silent_ones_chunks_go_straight_to_the_learner(tmp_path, seeding):
    """A new swarm's seeders (swarm/discovery.py `seeders`) are asked as owners only: a silent one's
    chunks go to the learner after one hedge, not to the other seeders (each of which would hold
    them for a wait), and no seeder's holder record is read. Credited mates hedge to each other."""
    from swarm.identity import Identity
    from swarm.wire.manifest import Manifest

    learner = Identity.load_or_create(tmp_path / "l.key")
    sealed = Manifest("m", "c", CHUNK_SIZE, (ENTRY,), learner.peer_id, 1.0, ENTRY.version).seal(learner)

    class Learner(ScriptedNode):
        read: list = []

        def call(self, peer, name, payload, timeout, stop=None):
            return sealed

        def holdings_of(self, peer_ids):
            self.read = list(peer_ids)
            return [Holder(peer_id="s2", chain="c", versions=[7])]

        def announce_holdings(self, chain, versions):
            return True

    # chunk_owner(["s1", "s2"], 7, i): s2 owns chunks 0 and 2, s1 (silent) owns 1 and 3
    node = Learner({"s1": "stall", "s2": "good", learner.peer_id: "good"})
    fetcher = WeightFetcher(node, lambda: learner.peer_id, mates=lambda: ["s1", "s2"], seeding=lambda: seeding,
                            cfg=FetchConfig(hedge_s=STEADY_HEDGE_S), parallel=2)
    try:
        got = fetcher.fetch("", -1)
    finally:
        node.released.set()
        fetcher.close()
    assert got[0].blob == BLOB
    asked = collections.defaultdict(set)
    for peer, indices, _ in node.asked:
        asked[peer] |= set(indices)
    if seeding:
        assert asked == {"s1": {1, 3}, "s2": {0, 2}, learner.peer_id: {1, 3}} and node.read == [], (asked, node.read)
    else:  # s2 is read as a holder (asked first for every chunk) and takes s1's hedges: the learner is not asked
        assert asked["s2"] == {0, 1, 2, 3} and learner.peer_id not in asked and node.read == ["s1", "s2"], asked
