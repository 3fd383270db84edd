"""What a node keeps and serves of the records that decide who trains (swarm/directory/): in process,
each directory's calls going straight to another's `serve` (over the wire: tests/integration)."""

import math

import msgspec
import pytest
from hivemind.utils import get_dht_time

from swarm.directory.book import MAX_NAMED
from swarm.directory.directory import Directory
from swarm.dht.records import swarm_record
from swarm.identity import Identity
from swarm.p2p.doors import Doors
from swarm.wire.directory import DIRECTORY, DirectoryReply, DirectoryRequest, Want
from swarm.wire.peer import PeerInfo
from swarm.wire.tally import Contribution, Tally


@pytest.fixture(scope="module")
def ids(tmp_path_factory):
    base = tmp_path_factory.mktemp("ids")
    return {n: Identity.load_or_create(base / f"{n}.key") for n in ("boot", "learner", "sampler", "stranger")}


class Net:
    """Directories by peer id; a call is the callee's `serve` (or an error if it is not there)."""

    def __init__(self) -> None:
        self.dirs, self.calls = {}, []

    def add(self, ident: Identity, coordinators: set[str]) -> Directory:
        def call(peer, payload, timeout):
            self.calls.append((ident.peer_id, peer, len(payload)))
            if peer not in self.dirs:
                raise ConnectionError("unreachable")
            return self.dirs[peer].serve(payload, ident.peer_id)

        d = Directory(ident, "s", coordinators, call, answered=lambda peer: -math.inf, door=Doors().open(DIRECTORY))
        self.dirs[ident.peer_id] = d
        return d


def _card(ident: Identity) -> PeerInfo:
    return PeerInfo(peer_id=ident.peer_id, role="learner", model_id="m", version=1, engine="hf", throughput=1.0,
                    updated=float(get_dht_time()))


def _tally(ident: Identity, credited: list[str], seq: int = 1) -> Tally:
    c = Contribution(groups=1, rollouts=4, tokens=10, first=1.0, last=2.0, models=["m"])
    return Tally(learner=ident.peer_id, seq=seq, time=2.0, model_id="m", peers={p: c for p in credited})


def _swarm(ids, learners=("learner",)):
    net = Net()
    boot = net.add(ids["boot"], set())
    boot.hold_own("swarm", swarm_record(ids["boot"], {ids[n].peer_id: "m" for n in learners}), ttl=60)
    learner = net.add(ids["learner"], {ids["boot"].peer_id})
    sampler = net.add(ids["sampler"], {ids["boot"].peer_id})
    return net, boot, learner, sampler


def test_a_sampler_learns_the_named_learners_records_from_the_coordinator(ids):
    net, boot, learner, sampler = _swarm(ids)
    card = _card(ids["learner"])
    learner.hold_own("peer", card, ttl=60)
    learner.hold_own("tally", _tally(ids["learner"], [ids["sampler"].peer_id]), ttl=600)
    assert learner.push() == 1  # the coordinator names it: it keeps both
    net.dirs.pop(ids["learner"].peer_id)  # the learner cannot be asked: its tally comes from the coordinator
    sampler.want_tally(ids["learner"].peer_id)
    sampler.refresh(force=True)
    assert sampler.book.named() == {ids["learner"].peer_id: "m"}
    assert sampler.record("peer", ids["learner"].peer_id) == card
    assert sampler.record("tally", ids["learner"].peer_id).peers.keys() == {ids["sampler"].peer_id}
    assert sampler.book.favours(ids["sampler"].peer_id)  # credited: its DHT rows go to the favoured pool


def test_tallies_come_from_their_owner_while_it_answers(ids):
    net, boot, learner, sampler = _swarm(ids)
    learner.hold_own("peer", _card(ids["learner"]), ttl=60)
    learner.push()
    learner.hold_own("tally", _tally(ids["learner"], [ids["sampler"].peer_id], seq=7), ttl=600)  # not pushed
    sampler.want_tally(ids["learner"].peer_id)
    sampler.refresh(force=True)
    assert sampler.record("tally", ids["learner"].peer_id).seq == 7
    asked_boot = [size for caller, callee, size in net.calls if caller == ids["sampler"].peer_id
                  and callee == ids["boot"].peer_id]
    assert len(asked_boot) == 2  # swarm record and peer records (twice: a newcomer learns whom to ask first)


def test_only_records_a_coordinator_names_are_kept(ids):
    net, boot, learner, sampler = _swarm(ids)
    stranger = net.add(ids["stranger"], {ids["boot"].peer_id})
    stranger.hold_own("peer", _card(ids["stranger"]), ttl=60)
    stranger.hold_own("tally", _tally(ids["stranger"], [ids["sampler"].peer_id]), ttl=600)
    assert stranger.push() == 0
    assert boot.book.get("peer", ids["stranger"].peer_id) is None
    assert boot.stats["offers_refused"] == 2 and boot.book.nbytes() < 4096


def test_a_newer_copy_replaces_an_older_one_and_a_replay_does_not(ids):
    net, boot, learner, sampler = _swarm(ids)
    old = learner.hold_own("peer", _card(ids["learner"]), ttl=30)
    learner.push()
    new = learner.hold_own("peer", msgspec.structs.replace(_card(ids["learner"]), version=9), ttl=60)
    learner.push()
    assert boot.book.get("peer", ids["learner"].peer_id).entry == new
    reply = DirectoryReply.decode(boot.serve(DirectoryRequest(offer=[old]).encode(), ids["stranger"].peer_id))
    assert reply.taken == 0 and boot.book.get("peer", ids["learner"].peer_id).entry == new


def test_a_want_gets_only_what_is_newer_than_the_askers(ids):
    net, boot, learner, sampler = _swarm(ids)
    entry = learner.hold_own("peer", _card(ids["learner"]), ttl=60)
    learner.push()
    ask = lambda have: DirectoryReply.decode(boot.serve(  # noqa: E731
        DirectoryRequest(wants=[Want("peer", ids["learner"].peer_id, have)]).encode(), ids["sampler"].peer_id))
    assert ask(0.0).entries == [entry]
    assert ask(entry.expires).entries == []


def test_malformed_and_forged_requests_are_answered_and_counted(ids):
    net, boot, learner, sampler = _swarm(ids)
    assert DirectoryReply.decode(boot.serve(b"\x93garbage", ids["stranger"].peer_id)).error == "malformed"
    entry = learner.hold_own("peer", _card(ids["learner"]), ttl=60)
    forged = msgspec.structs.replace(entry, value=entry.value.replace(b"hf", b"HF"))
    reply = DirectoryReply.decode(boot.serve(DirectoryRequest(offer=[forged]).encode(), ids["stranger"].peer_id))
    assert reply.taken == 0 and boot.stats["invalid"] == 1 and boot.stats["malformed"] == 1


def test_a_book_keeps_at_most_max_named_learners(ids, tmp_path):
    net = Net()
    boot = net.add(ids["boot"], set())
    many = {f"Qm{i:044d}": "" for i in range(MAX_NAMED + 10)}
    boot.hold_own("swarm", swarm_record(ids["boot"], many), ttl=60)
    assert len(boot.book.named()) == MAX_NAMED
