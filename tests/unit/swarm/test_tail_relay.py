"""Which askers the learner sends a tail and which a notice naming its relays (`Segment`), by hand,
no network. (Over the real protocol, relays serving it and failing to: tests/integration/swarm/
test_tail_relay_wire.py.)"""

from swarm.identity import Identity
from swarm.weights.server import Segment
from swarm.wire.manifest import Manifest, TailNotice, VersionEntry, tail_digest


def _segment(tmp_path, relays: int) -> tuple[Segment, Identity]:
    learner = Identity.load_or_create(tmp_path / "l.key")
    entries = tuple(VersionEntry.of_blob(v, None if v == 0 else v - 1, bytes([v]) * 100) for v in range(4))
    return Segment(Manifest("m", "c", 1 << 20, entries, learner.peer_id, 1.0, 0), learner, relays), learner


def test_a_tail_goes_to_its_first_proven_relays_then_as_notices_naming_them(tmp_path):
    seg, learner = _segment(tmp_path, relays=2)
    holds = ("c", 2)  # the version before the newest (3): a sampler keeping up
    tail = seg.for_asker(holds, "p1", notice=True, relay=True, proven=True)  # the first relay
    opened = Manifest.open(tail, learner.peer_id)
    assert [e.version for e in opened.versions] == [3] and opened.first == 0
    # a key the learner has not proven gets the tail but is never named; nor is one that does not relay
    assert seg.for_asker(holds, "fresh", notice=True, relay=True, proven=False) == tail
    assert seg.for_asker(holds, "private", notice=True, relay=False, proven=True) == tail
    assert seg.for_asker(holds, "p2", notice=False, relay=True, proven=True) == tail  # the second relay
    # the relays are named: an asker that takes notices gets one, pinning the tail by its sha256
    notice = TailNotice.decode(seg.for_asker(holds, "p3", notice=True, relay=True, proven=True))
    assert notice == TailNotice("c", 3, 2, tail_digest(tail), ("p1", "p2"))
    assert len(notice.encode()) < len(tail) / 3
    # one that does not take notices still gets the tail, and a relay asking again gets its tail
    assert seg.for_asker(holds, "p4", notice=False, relay=True, proven=True) == tail
    assert seg.for_asker(holds, "p1", notice=True, relay=True, proven=True) == tail
    # the whole segment (to an asker holding nothing, or a version not among the last few) is never a notice
    assert seg.for_asker(None) == seg.whole
    assert seg.for_asker(("other", 2), "p5", notice=True, relay=True, proven=True) == seg.whole
    # another tail (after v1) has relays of its own
    assert Manifest.open(seg.for_asker(("c", 1), "p3", notice=True, relay=True, proven=True),
                         learner.peer_id).versions[0].version == 2


def test_no_relays_means_a_notice_from_the_first_ask_and_a_new_publication_names_them_again(tmp_path):
    seg, _ = _segment(tmp_path, relays=0)
    notice = TailNotice.decode(seg.for_asker(("c", 2), "p1", notice=True, relay=True, proven=True))
    assert notice.relays == () and notice.version == 3 and notice.after == 2
    seg2, _ = _segment(tmp_path, relays=1)  # (a publication replaces the segment: its relays start empty)
    assert not TailNotice.is_notice(seg2.for_asker(("c", 2), "p9", notice=True, relay=True, proven=True))
