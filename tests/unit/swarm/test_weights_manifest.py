"""The weight protocol's wire records by hand, no network: the manifest (`Manifest`, `VersionEntry`)
and the manifest and chunk requests encode to exactly the bytes the pre-package code
(swarm/weight_rpc.py, a dict literal packed with msgpack) sent, decode back, and refuse what is
malformed or forged."""

import hashlib

import msgpack
import pytest

from swarm.identity import Identity
from swarm.wire.rollout import RecordError
from swarm.p2p import MAX_MESSAGE
from swarm.wire.rollout import MAX_ID
from swarm.wire.chunks import CHUNK_SIZE, MAX_REQUEST_WAIT, ChunkRequest
from swarm.weights import FetchConfig
from swarm.wire.manifest import Manifest, ManifestRequest, TailNotice, TailRequest, VersionEntry, tail_digest
from swarm.p2p.doors import DOORS
from swarm.wire.chunks import CHUNKS
from swarm.weights.chunks import INDEX_COST
from swarm.wire.chunks import MAX_INDICES, MAX_REQUEST_BYTES, ChunkRequestError, chunk_digest, chunk_size, split_blob

KEYFRAME = bytes(range(256)) * 5000  # two 1 MiB chunks in the pinned encoding below, the second short
# What swarm/weight_rpc.py's WeightServer.publish packed (before sealing) after publishing
# (tiny-model, chain-a, v3, keyframe, KEYFRAME) then (v4, base 3, b"patch") as peer "QmLearner"
# at time.time() == 1700000000.25: captured from that code before it was removed.
OLD_ENCODING = bytes.fromhex(
    "86a86d6f64656c5f6964aa74696e792d6d6f64656ca5636861696ea7636861696e2d61aa6368756e6b5f73697a65ce00100000a87665"
    "7273696f6e739284a776657273696f6e03a462617365ffa473697a65ce00138800a66368756e6b7392d94066626261623238396637"
    "663934623235373336633538626534366139393463343431666430323535326363363032323335326533643836643266616237633833"
    "d9403162343864653030656262306539366265383334613966313236326165623165366536343062306133303439393739353233376331"
    "653736323462383364616284a776657273696f6e04a46261736503a473697a6505a66368756e6b7391d94061343839356562343461666333"
    "333666656362626136653532306364363765313738646163653032373636353564313032666365666661386535663730353730a76c65"
    "61726e6572a9516d4c6561726e6572a474696d65cb41d954fc40100000")


def manifest() -> Manifest:
    # cut in 1 MiB as the old code cut everything (today a version this small is cut in 20 chunks of
    # MIN_CHUNK, `chunk_size`): what is pinned here is the record's encoding, not the cut
    old_cut = tuple(chunk_digest(KEYFRAME[i : i + CHUNK_SIZE]) for i in range(0, len(KEYFRAME), CHUNK_SIZE))
    entries = (VersionEntry(3, None, len(KEYFRAME), old_cut), VersionEntry.of_blob(4, 3, b"patch"))
    return Manifest("tiny-model", "chain-a", CHUNK_SIZE, entries, "QmLearner", 1700000000.25, 3)


# hetero.manifest.v2: the old literal with the segment's first version after its fields
V2_ENCODING = OLD_ENCODING[:1].replace(b"\x86", b"\x87") + OLD_ENCODING[1:] + b"\xa5first\x03"
# hetero.manifest.v3: v2's bytes with each hash a bin8 of its 32 raw bytes (c4 20) where v2 had a
# str8 of its 64 hex digits (d9 40)
V3_ENCODING = V2_ENCODING
for _entry in msgpack.unpackb(V2_ENCODING, raw=False)["versions"]:
    for _digest in _entry["chunks"]:
        V3_ENCODING = V3_ENCODING.replace(b"\xd9\x40" + _digest.encode(), b"\xc4\x20" + bytes.fromhex(_digest))


def test_a_manifest_encodes_to_the_bytes_the_old_dict_literal_did_with_raw_hashes_and_its_first_version():
    v2 = msgpack.unpackb(V2_ENCODING, raw=False)
    assert V2_ENCODING == msgpack.packb({**msgpack.unpackb(OLD_ENCODING, raw=False), "first": 3})
    assert len(V3_ENCODING) == len(V2_ENCODING) - 3 * 32  # three hashes, 32 bytes smaller each
    assert manifest().encode() == V3_ENCODING
    v3 = msgpack.unpackb(V3_ENCODING, raw=False)
    assert [[c.hex() for c in e["chunks"]] for e in v3["versions"]] == [e["chunks"] for e in v2["versions"]]
    # and that is the old literal, field by field, in its order (a keyframe's base is -1 on the wire)
    old = msgpack.unpackb(OLD_ENCODING, raw=False)
    assert list(old) == ["model_id", "chain", "chunk_size", "versions", "learner", "time"]
    assert [list(e) for e in old["versions"]] == [["version", "base", "size", "chunks"]] * 2
    assert [e["base"] for e in old["versions"]] == [-1, 3]


def test_a_manifest_decodes_to_its_records_and_back_to_the_same_bytes():
    m = Manifest.decode(V3_ENCODING)
    assert m == manifest()
    assert [(e.version, e.base, e.size, len(e.chunks)) for e in m.versions] == [(3, None, len(KEYFRAME), 2), (4, 3, 5, 1)]
    assert m.encode() == V3_ENCODING
    assert m.segment() == range(3, 5)  # v3 and v4


def test_unknown_manifest_fields_are_ignored_and_missing_or_mistyped_ones_refused():
    d = msgpack.unpackb(V3_ENCODING, raw=False)
    assert Manifest.decode(msgpack.packb({**d, "later": 1})) == manifest()
    chunks = d["versions"][0]["chunks"]
    for bad in ({k: v for k, v in d.items() if k != "chain"}, {**d, "time": "now"},
                msgpack.unpackb(OLD_ENCODING, raw=False), {**d, "first": "3"},  # v1's, without `first`
                msgpack.unpackb(V2_ENCODING, raw=False),  # v2's: hashes in hex
                {**d, "versions": [{**d["versions"][0], "chunks": [1, 2]}]},
                {**d, "versions": [{**d["versions"][0], "chunks": [chunks[0], chunks[1][:31]]}]},  # a hash cut short
                {**d, "versions": [{**d["versions"][0], "chunks": [chunks[0], chunks[1] + b"\x00"]}]},
                {**d, "versions": [{**d["versions"][0], "size": None}]}, [1, 2]):
        with pytest.raises(RecordError) as e:
            Manifest.decode(msgpack.packb(bad))
        assert e.value.reason == "schema", bad


def test_a_sealed_manifest_opens_for_its_learner_only(tmp_path):
    learner, forger = (Identity.load_or_create(tmp_path / f"{name}.key") for name in ("l", "f"))
    sealed = manifest().seal(learner)
    assert Manifest.open(sealed, learner.peer_id) == manifest()
    forged = []
    with pytest.raises(RecordError) as e:
        Manifest.open(manifest().seal(forger), learner.peer_id, forged=lambda: forged.append(1))
    assert e.value.reason == "signature" and forged == [1]


def test_requests_encode_as_the_old_lists_and_decode_back():
    assert ManifestRequest("c", 4, 10.0).encode() == msgpack.packb(["c", 4, 10.0, False, False])
    assert ManifestRequest("c", 4, 0.0).encode() == msgpack.packb(["c", 4, 0.0, False, False])  # no long poll: still says what it holds
    assert ManifestRequest("c", 4, 2.5, notice=True, relay=True).encode() == msgpack.packb(["c", 4, 2.5, True, True])
    assert ManifestRequest.decode(msgpack.packb(["c", 4, 2.5, True, False])) == ManifestRequest("c", 4, 2.5, True, False)
    assert ManifestRequest.decode(b"") is None
    for bad in (b"\xc1", msgpack.packb([1, 2, 3, False, False]), msgpack.packb(["c", 0, 9.0]),  # v2's, without flags
                msgpack.packb(["c", 0, 9.0, 1, 0]), msgpack.packb(["c", 0, 9.0, False, False, "x" * 600])):
        with pytest.raises(Exception):
            ManifestRequest.decode(bad)
    request = ChunkRequest("c", 4, [0, 2, 4], 5.0)
    assert request.encode() == msgpack.packb(["c", 4, [0, 2, 4], 5.0])
    assert ChunkRequest.decode(request.encode()) == request
    # the largest request that follows the protocol decodes; past any of its bounds, refused with a reason
    largest = ChunkRequest("\U0010ffff" * MAX_ID, -(1 << 63), [MAX_INDICES - 1] * MAX_INDICES, MAX_REQUEST_WAIT)
    assert len(largest.encode()) == MAX_REQUEST_BYTES and ChunkRequest.decode(largest.encode()) == largest
    for bad, reason in ((msgpack.packb(["c", 4, list(range(1 << 17)), 0.0]), "oversize"),  # 655 KB
                        (msgpack.packb(["c", 4, [0] * (MAX_INDICES + 1), 0.0]), "too_many"),
                        (b"\xc1", "undecodable"), (request.encode() + b"\x00", "undecodable"),
                        (msgpack.packb(["c" * 300, 4, [0], 0.0]), "undecodable"),  # a str longer than any chain
                        (msgpack.packb(["c", 4, {0: 1}, 0.0]), "undecodable"),
                        (msgpack.packb(["c" * (MAX_ID + 1), 4, [0], 0.0]), "schema"),
                        (msgpack.packb(["c", "4", [0], 0.0]), "schema"), (msgpack.packb(["c", 4, [0], -1.0]), "schema"),
                        (msgpack.packb(["c", 4, [0], float("nan")]), "schema"),
                        (msgpack.packb(["c", 4, [MAX_INDICES], 0.0]), "schema"),
                        (msgpack.packb(["c", 4, [-1], 0.0]), "schema"), (msgpack.packb(["c", 4, [0]]), "schema")):
        with pytest.raises(ChunkRequestError) as e:
            ChunkRequest.decode(bad)
        assert e.value.reason == reason, (bad[:40], e.value)


def test_a_tail_notice_and_a_tail_request_encode_decode_and_refuse_what_is_malformed(tmp_path):
    sealed = manifest().seal(Identity.load_or_create(tmp_path / "l.key"))
    digest = tail_digest(sealed)
    assert digest == hashlib.sha256(sealed).digest() and len(digest) == 32
    notice = TailNotice("chain-a", 5, 4, digest, ("QmA", "QmB"))
    wire = notice.encode()
    assert wire == msgpack.packb(["chain-a", 5, 4, digest, ["QmA", "QmB"]])
    assert TailNotice.decode(wire) == notice
    # told from a sealed manifest (a msgpack map) by its first byte, and from b"" ("nothing newer")
    assert TailNotice.is_notice(wire) and not TailNotice.is_notice(sealed) and not TailNotice.is_notice(b"")
    for bad in (msgpack.packb(["chain-a", 5, 4, digest[:31], []]), msgpack.packb(["chain-a", 5, 4, digest]),
                msgpack.packb(["chain-a", "5", 4, digest, []]), msgpack.packb(["chain-a", 5, 4, digest, [1]]),
                msgpack.packb(["chain-a", 5, 4, digest, ["Qm"] * (TailNotice.MAX_RELAYS + 1)]), b"\x91\xc1"):
        with pytest.raises(RecordError) as e:
            TailNotice.decode(bad)
        assert e.value.reason == "schema", bad
    request = TailRequest("chain-a", 5, 4, digest)
    assert request.encode() == msgpack.packb(["chain-a", 5, 4, digest])
    assert TailRequest.decode(request.encode()) == request
    for bad in (msgpack.packb(["chain-a", 5, 4, digest[:31]]), msgpack.packb(["chain-a", 5, 4]), b"\xc1",
                msgpack.packb(["chain-a", 5, 4, "x" * 600])):
        with pytest.raises(Exception):
            TailRequest.decode(bad)


def test_the_chunk_requests_bounds_follow_the_largest_manifest_a_fetcher_reads():
    # a version has at most as many chunks as one manifest reply (under MAX_MESSAGE) can list
    entry = VersionEntry(0, None, 0, (chunk_digest(b"x"),) * MAX_INDICES)
    hashes = len(msgpack.packb(entry.to_wire()["chunks"])) - 5  # less the list's header
    assert hashes == 34 * MAX_INDICES <= MAX_MESSAGE < hashes + 34
    assert MAX_INDICES * CHUNK_SIZE > 64 * 10 ** 9  # a 32B keyframe in bf16 fits
    assert INDEX_COST * MAX_INDICES < DOORS[CHUNKS].byte_burst  # the largest request within one burst


def test_a_version_is_cut_in_at_least_64_chunks_of_a_power_of_two_from_64_kib_to_1_mib():
    KiB, MiB = 1024, 1024 * 1024
    # (size, chunk): 20 MiB / 64 = 320 KiB, the power of two under it 256 KiB (80 chunks); 63 MiB / 64
    # = 1008 KiB: 512 KiB (126); from 64 MiB on, 1 MiB; under 4 MiB, the floor of 64 KiB
    for size, chunk in [(1, 64 * KiB), (4 * MiB, 64 * KiB), (4 * MiB + 64 * 128, 64 * KiB),
                        (8 * MiB, 128 * KiB), (20 * MiB, 256 * KiB), (63 * MiB, 512 * KiB),
                        (64 * MiB, MiB), (1200 * MiB, MiB)]:
        assert chunk_size(size) == chunk, size
    assert [len(c) for c in split_blob(bytes(20 * MiB + 5))] == [256 * KiB] * 80 + [5]
    assert len(VersionEntry.of_blob(1, 0, bytes(20 * MiB)).chunks) == 80
    # from 4 MiB up to the cap, 64 to 128 chunks (8 MiB - 1: 128, the last short): a chain segment of
    # 100 such patches lists at most 100 x 128 hashes, well within one manifest reply
    assert len(split_blob(bytes(8 * MiB - 1))) == 128
    assert 100 * 128 * len(msgpack.packb(chunk_digest(b"x"))) < MAX_MESSAGE / 3


def test_one_bound_on_how_long_a_request_may_be_held():
    assert FetchConfig(long_poll_s=MAX_REQUEST_WAIT).long_poll_s == MAX_REQUEST_WAIT
    with pytest.raises(ValueError, match="long_poll_s"):
        FetchConfig(long_poll_s=MAX_REQUEST_WAIT + 1)


def test_the_learner_lists_only_the_versions_after_the_askers_when_it_holds_one_of_the_segment(tmp_path):
    from swarm.weights.server import Segment

    learner = Identity.load_or_create(tmp_path / "l.key")
    entries = tuple(VersionEntry.of_blob(v, None if v == 3 else v - 1, bytes([v]) * 10) for v in (3, 4, 5, 6))
    segment = Segment(Manifest("m", "c", CHUNK_SIZE, entries, learner.peer_id, 1.0, 3), learner)
    listed = lambda holds: [e.version for e in Manifest.open(segment.for_asker(holds), learner.peer_id).versions]  # noqa: E731
    assert listed(("c", 3)) == [4, 5, 6] and listed(("c", 5)) == [6]
    # nothing of this segment (another chain, older than its keyframe, or nothing at all): all of it
    for holds in (("other", 5), ("c", 2), None):
        assert listed(holds) == [3, 4, 5, 6], holds
    # a tail is sealed once per version asked after, then served as is; it keeps the segment's first
    assert segment.for_asker(("c", 4)) is segment.for_asker(("c", 4))
    tail = Manifest.open(segment.for_asker(("c", 4)), learner.peer_id)
    assert tail.first == 3 and tail.segment() == range(3, 7)
    # versions published with gaps (every few steps), 12 of them: a tail only after one of the 8
    # published before the newest (v15 .. v50); a version never published, or older, gets the whole
    gapped = tuple(VersionEntry.of_blob(v, None if v == 0 else v - 5, b"x") for v in range(0, 60, 5))
    segment = Segment(Manifest("m", "c", CHUNK_SIZE, gapped, learner.peer_id, 1.0, 0), learner)
    whole = [e.version for e in gapped]
    assert listed(("c", 15)) == [20, 25, 30, 35, 40, 45, 50, 55] and listed(("c", 50)) == [55]
    for holds in (("c", 10), ("c", 12), ("c", 55), ("c", 99)):
        assert listed(holds) == whole, holds


def test_a_fetch_planned_from_a_tail_takes_the_newer_deltas_and_never_a_delta_without_its_base():
    from swarm.exchange import plan_fetch

    # the segment starts at keyframe 3; a sampler at v4 was told of v5 and v6 only
    assert plan_fetch("c", [5, 6], "c", 4, first=3) == [5, 6]
    assert plan_fetch("c", [3, 4, 5, 6], "c", 4, first=3) == [5, 6]  # the whole segment: the same
    # a tail reaching one who holds nothing of the segment (it lacks the keyframe): nothing to apply
    assert plan_fetch("c", [5, 6], "c", 2, first=3) == [] and plan_fetch("c", [5, 6], "other", 4, first=3) == []
    assert plan_fetch("c", [3, 4, 5, 6], "other", 4, first=3) == [3, 4, 5, 6]
