"""Versions over real hivemind RPC between in-process peers: exact deltas, chunks served by other
holders so the learner's upload stays flat, forged manifests and corrupted chunks refused."""

import asyncio
import threading
import time

import msgpack
import pytest
import torch

from helpers.wait import until
from node.models import BUILTIN_MODEL, load_model
from node.weights.codec import Publisher, PublishConfig, apply_version
from node.weights.blob import decode_version, encode_version, untie
from swarm.dht.network import NetworkConfig
from swarm.wire.manifest import Manifest, ManifestRequest, VersionEntry
from swarm.identity import Identity
from swarm.exchange import WeightVersion
from swarm.p2p import SwarmNode
from swarm.wire.chunks import MIN_CHUNK
from swarm.weights import FetchConfig, PeerStrikes, WeightFetcher, WeightPrefetcher, WeightServer
from swarm.weights.server import Segment


@pytest.fixture(scope="module")
def peers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wt")
    ln = SwarmNode(Identity.load_or_create(tmp / "l.key"), NetworkConfig(), "wt")
    nodes = [ln] + [SwarmNode(Identity.load_or_create(tmp / f"s{i}.key"), NetworkConfig(initial_peers=ln.maddrs()), "wt")
                    for i in range(2)]
    lx = WeightServer(ln)
    mates = [n.peer_id for n in nodes[1:]]
    sxs = [WeightFetcher(n, lambda: ln.peer_id, mates=lambda: mates) for n in nodes[1:]]
    yield lx, sxs
    for sx in sxs:
        sx.close()
    for n in reversed(nodes):
        n.shutdown()


def publish(lx, v: int, enc, chain: str, aliases: dict) -> bytes:
    blob = encode_version(enc, BUILTIN_MODEL, chain, aliases)
    lx.publish(WeightVersion(BUILTIN_MODEL, chain, v, enc.base, blob))
    return blob


def blobs_of(versions):
    return None if versions is None else [w.blob for w in versions]


def publish_versions(lx, n, chain):
    weights, aliases = untie(load_model(BUILTIN_MODEL).state_dict())
    pub = Publisher(PublishConfig(view="float32", keyframe_bytes=100), torch.float32)
    gen = torch.Generator().manual_seed(0)
    for v in range(n):
        weights = {k: t + 1e-3 * torch.randn(t.shape, generator=gen) for k, t in weights.items()}
        publish(lx, v, pub.publish(weights, v), chain, aliases)
    return pub


def apply_all(published, blobs):
    for blob in blobs:
        enc, _ = decode_version(blob)
        published = apply_version(published if enc.base is not None else None, enc)
    return published


def _holds(reader, holder: str, chain: str, version: int) -> None:
    """Wait until `reader` (a SwarmNode) reads `holder`'s record of holding `version` in the DHT."""
    until(lambda: any(h.chain == chain and version in h.versions for h in reader.holdings_of([holder])),
          f"{chain} v{version} held by {holder}, as the DHT says", every=0.05)


def test_keyframe_then_deltas_reconstruct_bit_exactly_and_holders_spare_the_learner(peers):
    lx, (s1, s2) = peers
    # the peers are the module's: counts are taken from here, whatever earlier tests moved
    up0, s1_up0, s1_held0, s2_held0 = (lx.store.served_bytes, s1.store.served_bytes, s1.stats["bytes_from_holders"],
                                       s2.stats["bytes_from_holders"])
    pub = publish_versions(lx, 4, "run1")
    blobs = blobs_of(s1.fetch("", -1))  # nothing held yet: the keyframe and every delta
    assert [decode_version(b)[0].version for b in blobs] == [0, 1, 2, 3]
    got = apply_all(None, blobs)
    assert torch.equal(got, pub.published)
    uploaded = lx.store.served_bytes - up0
    assert uploaded == sum(len(b) for b in blobs) and s1.stats["bytes_from_holders"] == s1_held0
    _holds(s2.node, s1.node.peer_id, "run1", 3)  # s1 announces what it fetched
    blobs2 = blobs_of(s2.fetch("", -1))
    assert blobs2 == blobs
    assert lx.store.served_bytes - up0 == uploaded  # the second sampler got every byte from the first
    assert s2.stats["bytes_from_holders"] - s2_held0 == uploaded and s1.store.served_bytes - s1_up0 == uploaded
    # one more version: only the new delta travels
    publish(lx, 4, pub.publish({k: t + 1e-3 for k, t in pub.layout.tensors(pub.published).items()}, 4), "run1", {})
    newer = blobs_of(s1.fetch("run1", 3))
    assert [decode_version(b)[0].version for b in newer] == [4]
    # it was told of v4 alone (the manifest's tail after v3), and keeps serving the segment it holds
    assert sorted(s1.store.blobs) == [0, 1, 2, 3, 4]
    assert torch.equal(apply_all(got, newer), pub.published)
    # a new keyframe starts the learner's next segment: the sampler prunes what it no longer lists
    pub.cfg = PublishConfig(view="float32", keyframe_every=1)
    publish(lx, 5, pub.publish(pub.layout.tensors(pub.published), 5), "run1", {})
    assert [decode_version(b)[0].version for b in blobs_of(s1.fetch("run1", 4))] == [5]
    assert sorted(s1.store.blobs) == [5]


def test_a_corrupted_chunk_from_a_holder_is_fetched_again_elsewhere(peers):
    lx, (s1, s2) = peers
    publish_versions(lx, 1, "run2")
    good = blobs_of(s1.fetch("", -1))
    _holds(s2.node, s1.node.peer_id, "run2", 0)
    bad = bytearray(s1.store.blobs[0])
    bad[len(bad) // 2] ^= 0xFF  # the holder's copy is damaged
    s1.store.blobs[0] = bytes(bad)
    before_bad, before_up, demoted = s2.stats["bad_chunks"], lx.store.served_bytes, s2.demoted[s1.node.peer_id]
    assert blobs_of(s2.fetch("", -1)) == good  # the learner served the chunk the holder spoiled
    assert s2.stats["bad_chunks"] == before_bad + 1 and lx.store.served_bytes > before_up
    # the holder that lied is demoted: s2 does not ask it first again for a while
    assert s2.demoted[s1.node.peer_id] == demoted + 1 and s2.strikes.benched(s1.node.peer_id, time.monotonic())
    s2.strikes = PeerStrikes(s2.cfg.demote_s, s2.cfg.demote_max_s, s2.cfg.forget_s)  # later tests share s1 as a mate


def test_a_corrupted_chunk_with_no_good_source_is_never_applied(peers):
    lx, (s1, _) = peers
    publish_versions(lx, 1, "run3")
    blob = bytearray(lx.store.blobs[0])
    blob[len(blob) // 2] ^= 0xFF
    lx.store.blobs[0] = bytes(blob)
    before = s1.stats["bad_chunks"]
    assert s1.fetch("", -1) is None
    assert s1.stats["bad_chunks"] == before + 2  # the learner, the last resort, is asked twice


def test_a_manifest_not_signed_by_the_followed_learner_is_refused(peers, tmp_path):
    lx, (s1, _) = peers
    publish_versions(lx, 2, "run4")
    forger = Identity.load_or_create(tmp_path / "forger.key")
    forged = Manifest(BUILTIN_MODEL, "evil", 1, (VersionEntry.of_blob(0, None, b"x"),), s1.learner(), time.time(), 0)
    lx._segment = Segment(forged, forger)  # what the learner serves, sealed by another key
    before = s1.stats["forged_manifests"]
    assert s1.fetch("", -1) is None
    assert s1.stats["forged_manifests"] == before + 1


def publish_big_keyframe(lx, chain: str, mb: int = 4) -> bytes:
    """A version of several chunks (random fp32 weights), so that mates can split it."""
    weights = {"w": torch.randn(mb * 256, 1024, generator=torch.Generator().manual_seed(1))}
    return publish(lx, 0, Publisher(PublishConfig(view="float32"), torch.float32).publish(weights, 0), chain, {})


def test_mates_fetching_at_once_share_chunks_so_the_learner_uploads_one_copy(peers):
    lx, (s1, s2) = peers
    blob = publish_big_keyframe(lx, "run5")
    before, got = lx.store.served_bytes, {}
    threads = [threading.Thread(target=lambda s=s: got.setdefault(s, blobs_of(s.fetch("", -1)))) for s in (s1, s2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got[s1] == got[s2] == [blob]
    # each took its own half from the learner and the other half from its mate mid-download
    assert lx.store.served_bytes - before == len(blob)
    assert s1.store.served_bytes > 0 and s2.store.served_bytes > 0


def test_the_learner_names_as_seeders_the_peers_it_served_a_version_whole_and_no_one_else(peers, tmp_path):
    """A new swarm's sampler (no mates) takes a version whole from the learner: the learner's store
    names it first among its seeders (its tally's stand-in mates: swarm/discovery.py `seeders`).
    A sampler that takes half from the learner and half from a mate is not named."""
    lx, (s1, _) = peers
    nodes = [SwarmNode(Identity.load_or_create(tmp_path / f"n{i}.key"), NetworkConfig(initial_peers=s1.node.maddrs()), "wt")
             for i in range(3)]
    whole, a, b = nodes
    pair = sorted([a.peer_id, b.peer_id])
    fetchers = [WeightFetcher(whole, s1.learner)] + [WeightFetcher(n, s1.learner, mates=lambda: pair) for n in (a, b)]
    try:
        blob = publish_big_keyframe(lx, "run-seeders")
        assert blobs_of(fetchers[0].fetch("", -1)) == [blob]
        assert lx.store.seeders()[0] == whole.peer_id
        got = {}
        threads = [threading.Thread(target=lambda f=f: got.setdefault(f, blobs_of(f.fetch("", -1)))) for f in fetchers[1:]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert got[fetchers[1]] == got[fetchers[2]] == [blob]
        assert fetchers[1].stats["bytes_from_holders"] > 0 and fetchers[2].stats["bytes_from_holders"] > 0
        assert lx.store.seeders()[0] == whole.peer_id and not set(pair) & set(lx.store.seeders())
    finally:
        for f in fetchers:
            f.close()
        for n in reversed(nodes):
            n.shutdown()


def test_a_mate_that_is_not_fetching_costs_no_waiting(peers):
    lx, (s1, s2) = peers
    blob = publish_big_keyframe(lx, "run6")
    t0, before = time.monotonic(), s1.stats["bytes_from_learner"]
    assert blobs_of(s1.fetch("", -1)) == [blob]  # s2 owns half the chunks but is idle: the learner serves them
    assert time.monotonic() - t0 < s1.peer_wait  # s2 answered "not held" at once; nobody waited for it
    assert s1.stats["bytes_from_learner"] - before == len(blob)


def test_malformed_chunk_requests_are_refused_counted_and_serving_goes_on(peers):
    lx, (s1, _) = peers
    blob = publish_big_keyframe(lx, "run7", mb=2)
    learner, before = s1.learner(), lx.store.malformed
    replies = []
    for junk in (b"\xc1", msgpack.packb("not a list"), msgpack.packb(["run7", 0, list(range(140_000)), 0.0]),
                 msgpack.packb(["run7", "zero", [0], 0.0])):
        s1.node.call_stream(learner, "hetero.chunks.v2", junk, 10, replies.append)
    assert replies == [] and lx.store.malformed == before + 4
    # an unknown chain or version gets no chunk ("not held": the stream ends), not an error
    s1.node.call_stream(learner, "hetero.chunks.v2", msgpack.packb(["other", 0, [0, 1], 0.0]), 10, replies.append)
    assert replies == []
    assert blobs_of(s1.fetch("", -1)) == [blob]  # and the learner still serves


def test_a_keyframe_leaves_the_last_segment_served_until_the_next_one(peers):
    """Downloads under way from the manifest before a keyframe still finish after it."""
    lx, (s1, _) = peers
    learner = s1.learner()

    def served(version: int) -> bytes:
        replies = []
        s1.node.call_stream(learner, "hetero.chunks.v2", msgpack.packb(["run10", version, [0], 0.0]), 10, replies.append)
        return bytes(replies[0]) if replies else b""  # no chunk: not held

    for v, base in enumerate([None, 0, None, 2, None]):
        lx.publish(WeightVersion(BUILTIN_MODEL, "run10", v, base, bytes([v]) * 100))
        if v == 2:  # a new segment: the manifest lists v2 only, v0 and v1 are still served
            assert [served(u) for u in (0, 1, 2)] == [bytes([u]) * 100 for u in (0, 1, 2)]
    assert [served(u) for u in (0, 1)] == [b"", b""]  # dropped with the second keyframe after them
    assert [served(u) for u in (2, 3, 4)] == [bytes([u]) * 100 for u in (2, 3, 4)]


def test_a_mate_waits_for_a_version_it_is_about_to_fetch_not_for_older_ones(peers):
    """Asked for chunks of the version after all it holds, a mate waits (it polls the learner every
    second and will fetch it); one it skipped, or of a chain it does not follow, gets no chunk at once."""
    lx, (s1, s2) = peers
    s2.store.put("run11", 5, b"five")
    ask = lambda v, chain="run11": s1.node.call_stream(  # noqa: E731
        s2.node.peer_id, "hetero.chunks.v2", msgpack.packb([chain, v, [0], 3.0]), 10, replies.append)
    for version, chain in ((4, "run11"), (6, "other")):
        replies, t0 = [], time.monotonic()
        ask(version, chain)
        assert replies == [] and time.monotonic() - t0 < 2.0  # at once: well under the 3 s a waiting request takes
    replies, t0 = [], time.monotonic()
    arrive = threading.Timer(0.5, lambda: (s2.store.begin("run11", 6), s2.store.add_chunk("run11", 6, 0, b"six")))
    arrive.start()
    ask(6)
    assert [bytes(r) for r in replies] == [b"six"] and time.monotonic() - t0 >= 0.5
    replies, t0 = [], time.monotonic()
    ask(7)  # nobody brings it: the wait ends at its bound and the asker goes elsewhere
    assert replies == [] and 2.9 < time.monotonic() - t0 < 5
    # no waiting for any version a peer names: only the next one (6 is held in part, so 7)
    replies, t0 = [], time.monotonic()
    ask(9)
    assert replies == [] and time.monotonic() - t0 < 2.0  # at once: well under the 3 s a waiting request takes
    # one peer holds at most MAX_WAITING requests waiting; beyond that it is answered at once
    took = {}

    def timed(i):
        t = time.monotonic()
        s1.node.call_stream(s2.node.peer_id, "hetero.chunks.v2", msgpack.packb(["run11", 7, [0], 3.0]), 10, lambda _: None)
        took[i] = time.monotonic() - t
    threads = [threading.Thread(target=timed, args=(i,)) for i in range(s2.store.MAX_WAITING + 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sum(t > 2.9 for t in took.values()) == s2.store.MAX_WAITING and min(took.values()) < 2.0
    # the learner publishes, it never fetches: a request for its next version is answered at once
    lx.publish(WeightVersion(BUILTIN_MODEL, "run11", 0, None, b"zero"))
    replies, t0 = [], time.monotonic()
    s1.node.call_stream(s1.learner(), "hetero.chunks.v2", msgpack.packb(["run11", 1, [0], 3.0]), 10, replies.append)
    assert replies == [] and time.monotonic() - t0 < 2.0  # at once: well under the 3 s a waiting request takes


def test_the_prefetcher_downloads_apart_from_the_sampler_and_restarts_from_what_it_holds(peers, tmp_path):
    lx, (s1, _) = peers
    from swarm.weights import WeightPrefetcher

    node = SwarmNode(Identity.load_or_create(tmp_path / "s3.key"), NetworkConfig(initial_peers=s1.node.maddrs()), "wt")
    pub = publish_versions(lx, 3, "run12")
    pre = WeightPrefetcher(WeightFetcher(node, s1.learner), interval=0.2)

    def wait_take(chain, version):
        deadline = time.monotonic() + 20
        while (got := pre.take(chain, version)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return got

    try:
        got = wait_take("", -1)
        assert [(w.version, w.base) for w in got] == [(0, None), (1, 0), (2, 1)]
        assert torch.equal(apply_all(None, [w.blob for w in got]), pub.published)
        publish(lx, 3, pub.publish({k: t + 1e-3 for k, t in pub.layout.tensors(pub.published).items()}, 3), "run12", {})
        assert [(w.version, w.base) for w in wait_take("run12", 2)] == [(3, 2)]
        # the sampler refused v3 (it holds nothing now): what was fetched after it does not apply,
        # so the prefetcher starts over from the keyframe
        publish(lx, 4, pub.publish({k: t + 1e-3 for k, t in pub.layout.tensors(pub.published).items()}, 4), "run12", {})
        time.sleep(1.0)
        assert [(w.version, w.base) for w in wait_take("", -1)] == [(0, None), (1, 0), (2, 1), (3, 2), (4, 3)]
    finally:
        pre.close()
        node.shutdown()


def test_a_holder_announcing_a_huge_chunk_is_refused_before_it_is_read_and_counted(peers, tmp_path):
    """A peer with its own key announces it holds a version and answers chunk requests with a frame
    that claims 2^40 bytes: the fetcher refuses it from the length alone (hivemind's reader would
    buffer whatever it is sent), counts it, and takes the version from the learner."""
    from hivemind.p2p import P2P

    lx, (s1, _) = peers
    blob = publish_big_keyframe(lx, "run13", mb=2)
    liar = SwarmNode(Identity.load_or_create(tmp_path / "liar.key"), NetworkConfig(initial_peers=s1.node.maddrs()), "wt")
    sent = []

    async def huge(info, reader, writer):
        writer.write(P2P.MESSAGE_MARKER + (1 << 40).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER))
        for _ in range(64):  # and keeps sending: a reader that trusted the length would keep buffering
            writer.write(bytes(1 << 16))
            sent.append(1)
            try:
                await writer.drain()
            except ConnectionError:
                break
        writer.close()

    mates = s1.mates
    s1.mates = lambda: [*mates(), liar.peer_id]  # a credited mate gone bad: only mates' holder records are read
    try:
        liar.run(liar.p2p.add_binary_stream_handler("hetero.chunks.v2", huge), timeout=10)
        assert liar.announce_holdings("run13", [0])
        _holds(s1.node, liar.peer_id, "run13", 0)
        before = s1.stats["bad_streams"]
        assert blobs_of(s1.fetch("", -1)) == [blob]
        assert s1.stats["bad_streams"] > before and sent
    finally:
        s1.mates = mates
        liar.shutdown()


def test_a_sampler_follows_the_chain_across_a_keyframe_sent_in_place_of_a_larger_patch(peers, tmp_path):
    """The learner sends a keyframe out of schedule when the patch would be no smaller; a sampler
    fetching through its prefetcher rebuilds v0 (keyframe), v1 (patch), v2 (that keyframe), v3
    (a patch of it) bit for bit, each digest-checked, and its engine runs exactly the view."""
    from types import SimpleNamespace

    from node.engines.hf import HFEngine
    from node.models import load_tokenizer, tokenizer_hash
    from node.sampling.sampler import Sampler
    from node.tasks import ArithmeticTask
    from swarm.weights import WeightPrefetcher

    lx, (s1, _) = peers
    node = SwarmNode(Identity.load_or_create(tmp_path / "s4.key"), NetworkConfig(initial_peers=s1.node.maddrs()), "wt")
    tok = load_tokenizer(BUILTIN_MODEL)
    engine = HFEngine(load_model(BUILTIN_MODEL), tok, BUILTIN_MODEL)
    sampler = Sampler("s4", ArithmeticTask(), engine, tokenizer_hash(tok))
    pub = publish_versions(lx, 2, "run14")  # v0 keyframe, v1 patch (before polling: earlier tests' chains are gone)
    aliases = untie(load_model(BUILTIN_MODEL).state_dict())[1]  # tied embeddings travel once
    pre = WeightPrefetcher(WeightFetcher(node, s1.learner), interval=0.2)
    link = SimpleNamespace(fetch_weights=pre.take)  # what SwarmSamplerLink.fetch_weights is

    def follow(version: int) -> None:
        deadline = time.monotonic() + 30
        while sampler.version != version and time.monotonic() < deadline:
            sampler.maybe_update(link)
            time.sleep(0.1)
        assert sampler.version == version, (sampler.version, sampler.stats)

    try:
        follow(1)
        # weights rounded to a grid of 1/64: the patch would code every element's arbitrary step,
        # a keyframe a few bits per element
        grid = {k: torch.round(t * 64) / 64 for k, t in pub.layout.tensors(pub.published).items()}
        k2 = pub.publish(grid, 2)
        assert k2.base is None and k2.stats["weights_kind"] == "keyframe", k2.stats
        publish(lx, 2, k2, "run14", aliases)
        gen = torch.Generator().manual_seed(3)
        p3 = pub.publish({k: torch.where(torch.rand(t.shape, generator=gen) < 0.01, t + 1 / 64, t)
                          for k, t in grid.items()}, 3)
        assert p3.base == 2, p3.stats
        publish(lx, 3, p3, "run14", aliases)
        follow(3)
        assert torch.equal(sampler.published.view(torch.int32), pub.published.view(torch.int32))
        view = pub.layout.tensors(pub.published)
        loaded = engine.model.state_dict()
        assert all(torch.equal(loaded[k], t) for k, t in view.items()), [k for k in view if not torch.equal(loaded[k], view[k])]
        assert sampler.stats["weights_refused"] == sampler.stats["chain_breaks"] == 0, sampler.stats
    finally:
        pre.close()
        node.shutdown()


async def _trickle(info, reader, writer):
    """A frame header claiming a whole chunk (the smallest a version is cut in: within the bound
    on an item of any version), then a byte a second."""
    from hivemind.p2p import P2P

    writer.write(P2P.MESSAGE_MARKER + MIN_CHUNK.to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER))
    try:
        while True:
            await writer.drain()
            await asyncio.sleep(1.0)
            writer.write(b"\0")
    except ConnectionError:
        writer.close()


async def _silent(info, reader, writer):
    """Accepts the request and never answers."""
    await asyncio.sleep(3600)


@pytest.mark.parametrize("serve", [_trickle, _silent], ids=["trickling", "silent"])
def test_a_holder_of_every_version_that_stalls_is_hedged_demoted_and_the_sampler_keeps_up(peers, tmp_path, serve):
    """A mate (its learner credited it once) announces it holds every coming version and then
    trickles bytes (or says nothing). The sampler's stream to it is hedged to the learner, it is
    demoted and not asked again, its stream is abandoned mid-frame, and the sampler gets every
    version. (A stranger's holder record is never read: tests/unit/swarm/test_weights_gather.py.)"""
    lx, (s1, _) = peers
    chain = f"run15{serve.__name__}"
    bad = SwarmNode(Identity.load_or_create(tmp_path / "bad.key"), NetworkConfig(initial_peers=s1.node.maddrs()), "wt")
    node = SwarmNode(Identity.load_or_create(tmp_path / "s5.key"), NetworkConfig(initial_peers=s1.node.maddrs()), "wt")
    asked = []

    async def handler(info, reader, writer):
        asked.append(info.peer_id.to_base58())
        await serve(info, reader, writer)

    # demoted for longer than the test: every request it gets comes from the first fetch
    cfg = FetchConfig(idle_s=2.0, min_rate=256 * 1024, hedge_s=1.0, demote_s=600.0)
    fetcher = WeightFetcher(node, s1.learner, cfg=cfg, mates=lambda: [bad.peer_id])
    pre = None
    try:
        bad.run(bad.p2p.add_binary_stream_handler("hetero.chunks.v2", handler), timeout=10)
        assert bad.announce_holdings(chain, list(range(64)))
        _holds(node, bad.peer_id, chain, 0)
        pub = publish_versions(lx, 1, chain)
        pre = WeightPrefetcher(fetcher, interval=0.2)
        have, seen = ("", -1), []
        for v in range(1, 5):
            if v > 1:
                publish(lx, v - 1, pub.publish({k: t + 1e-3 for k, t in pub.layout.tensors(pub.published).items()},
                                               v - 1), chain, {})
            deadline = time.monotonic() + 60
            while have[1] != v - 1 and time.monotonic() < deadline:
                for wv in pre.take(*have) or []:
                    assert wv.blob == lx.store.blobs[wv.version], wv.version
                    seen.append(wv.version)
                    have = (wv.chain, wv.version)
                time.sleep(0.05)
            assert have == (chain, v - 1), (have, fetcher.stats)
        assert seen == [0, 1, 2, 3], seen
        bad_id = bad.peer_id
        assert asked and set(asked) == {node.peer_id}, asked  # it was asked, and held to account
        assert fetcher.demoted[bad_id] == 1 and fetcher.strikes.benched(bad_id, time.monotonic()), fetcher.demoted
        assert fetcher.stats["hedged_streams"] >= 1 and fetcher.stats["bytes_from_learner"] > 0, fetcher.stats
        assert len(asked) <= 4, asked  # one fetch's streams (`_split`); never again once demoted
        deadline = time.monotonic() + 30  # its streams are abandoned at their stall bounds, not held
        while fetcher.stats["stalled_streams"] < len(asked) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fetcher.stats["stalled_streams"] == len(asked), (fetcher.stats, asked)
    finally:
        if pre is not None:
            pre.close()
        else:
            fetcher.close()
        node.shutdown()
        bad.shutdown()


def _timed_call(node, learner, payload: bytes, timeout: float = 20.0) -> tuple[float, dict]:
    from swarm.wire.envelope import open_envelope
    from swarm.wire.manifest import MANIFEST

    t0 = time.monotonic()
    sealed = node.call(learner, MANIFEST, payload, timeout)
    return time.monotonic() - t0, msgpack.unpackb(open_envelope(sealed)[0], raw=False)


def test_a_long_poll_is_answered_the_moment_the_learner_publishes(peers):
    from swarm.wire.manifest import MANIFEST

    lx, (s1, _) = peers
    lx.publish(WeightVersion(BUILTIN_MODEL, "run20", 0, None, b"zero"))
    timer = threading.Timer(0.5, lambda: lx.publish(WeightVersion(BUILTIN_MODEL, "run20", 1, 0, b"one")))
    timer.start()
    took, manifest = _timed_call(s1.node, s1.learner(), ManifestRequest("run20", 0, 8.0).encode())
    assert took < 6.0  # at v1, not after the 8 s
    # listing only what the caller lacks: v1, in the segment that starts at v0
    assert [e["version"] for e in manifest["versions"]] == [1] and manifest["first"] == 0
    took, _ = _timed_call(s1.node, s1.learner(), ManifestRequest("run20", 0, 8.0).encode())
    assert took < 4.0  # the caller is behind already: no wait
    t0 = time.monotonic()
    assert s1.node.call(s1.learner(), MANIFEST, ManifestRequest("run20", 1, 1.0).encode(), 20.0) == b""
    assert time.monotonic() - t0 >= 0.9  # nothing newer: held for the wait asked, then told so (no manifest)
    # a poll (no wait) from a sampler that holds the newest: nothing newer too, not the whole segment
    assert s1.node.call(s1.learner(), MANIFEST, ManifestRequest("run20", 1, 0.0).encode(), 20.0) == b""
    took, manifest = _timed_call(s1.node, s1.learner(), b"")
    assert took < 4.0 and [e["version"] for e in manifest["versions"]] == [0, 1]  # a plain request: the whole segment at once


def test_long_polls_are_bounded_per_peer_and_malformed_requests_counted(peers):
    from swarm.wire.manifest import MANIFEST

    lx, (s1, s2) = peers
    lx.publish(WeightVersion(BUILTIN_MODEL, "run21", 0, None, b"zero"))
    before = dict(lx.stats)
    for bad in (b"\xc1", msgpack.packb([1, 2, 3]), msgpack.packb(["run21", 0, 9.0])):
        took, manifest = _timed_call(s2.node, s2.learner(), bad)
        assert manifest["chain"] == "run21" and took < 4.0  # answered at once, with the manifest
    assert lx.stats["malformed"] == before.get("malformed", 0) + 3
    poll = ManifestRequest("run21", 0, 5.0).encode()
    first = threading.Thread(target=s1.node.call, args=(s1.learner(), MANIFEST, poll, 20.0))
    first.start()
    time.sleep(1.0)  # s1's first request is waiting now
    t0 = time.monotonic()
    assert s1.node.call(s1.learner(), MANIFEST, poll, 20.0) == b""  # nothing newer than v0
    took = time.monotonic() - t0
    first.join(10)
    assert took < 3.0  # one waiting request per peer: the second is answered at once
    assert lx.stats["long_polls"] == before.get("long_polls", 0) + 1


def test_a_prefetcher_in_a_long_poll_stops_at_once(peers, tmp_path):
    lx, (s1, _) = peers
    node = SwarmNode(Identity.load_or_create(tmp_path / "s4.key"), NetworkConfig(initial_peers=s1.node.maddrs()), "wt")
    lx.publish(WeightVersion(BUILTIN_MODEL, "run22", 0, None, b"zero"))
    pre = WeightPrefetcher(WeightFetcher(node, s1.learner), interval=0.2)
    try:
        deadline = time.monotonic() + 20
        while pre.take("", -1) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # now held by the learner until it publishes (up to long_poll_s = 10 s)
        t0 = time.monotonic()
        pre.close()
        assert time.monotonic() - t0 < 2.0
    finally:
        node.shutdown()
