"""Several learners in one swarm (docs/DESIGN.md, "Several learners"): which learner a sampler
follows and which it feeds, its outbox of copies owed per learner, and a coordinator's list of
learners. Real rollouts over the real protocol to two real receivers and a dead peer, in one
process: tests/integration/swarm/test_fanout_wire.py; three learners as processes:
tests/integration/swarm/test_swarm_learners.py."""

from __future__ import annotations

from node.learner.config import ForeignConfig

import sqlite3
import time

import msgspec
import pytest

from cli.errors import UserError
from cli.roles import accepted_models, parse_learners, read_learners_file
from node.learner import LearnerConfig
from swarm.discovery import MAX_MATES, SEEDER_MATES, choose, earned, most_recent, protocol_mismatch, seeders, skipped_for_protocol, swarm_model, takes
from swarm.wire.tally import MAX_SEEDERS
from swarm.identity import peer_id_of
from swarm.rollouts.outbox import OWN, Outbox
from swarm.wire.peer import PROTOCOL, PeerInfo
from swarm.wire.tally import Contribution, Tally


QM_A, QM_B, QM_C = (peer_id_of(k) for k in (b"a", b"b", b"c"))  # real peer ids (Qm...), of no key

def learner(pid: str, model: str, accepts: list[str] = ()) -> PeerInfo:
    return PeerInfo(peer_id=pid, role="learner", model_id=model, version=0, engine="hf", throughput=0.0,
                    accepts=list(accepts))


def sampler(pid: str, model: str, follows: str, private: bool = False) -> PeerInfo:
    return PeerInfo(peer_id=pid, role="sampler", model_id=model, version=0, engine="hf", throughput=0.0,
                    learner=follows, private=private)


def test_only_mates_the_followed_learners_tally_credits_share_downloads():
    def tally(learner: str, credit: dict[str, int]) -> Tally:
        return Tally(learner=learner, seq=1, time=1.0, model_id="m", peers={
            p: Contribution(groups=n, rollouts=8 * n, tokens=0, first=1.0, last=1.0, models=["m"]) for p, n in credit.items()})
    announced = ["S1", "S2", "SYBIL1", "SYBIL2", "S3"]
    tallies = [tally("LA", {"S1": 3, "S2": 1, "S3": 0}), tally("LB", {"SYBIL1": 9})]
    assert earned(announced, tallies, "LA") == ["S1", "S2"]  # S3: no credit yet; LB's word is not LA's
    assert earned(announced, tallies, "LB") == ["SYBIL1"]
    assert earned(announced, tallies, "LC") == [] and earned(announced, [], "LA") == []
    many = [f"S{i:04d}" for i in range(3 * MAX_MATES)]
    top = earned(many, [tally("LA", {p: i + 1 for i, p in enumerate(many)})], "LA")
    assert top == sorted(many[-MAX_MATES:])  # the most credited, in the order every sampler computes


def test_a_new_swarm_shares_downloads_with_the_seeders_its_learner_names_until_it_credits_a_mate():
    """No sampler of a new swarm has earned anything: each took every version whole from the learner
    (one upload per sampler). The learner names the peers it served a version whole to; they stand in
    for mates, only among the records a sampler checked (public samplers of its model and learner),
    and only until the learner credits one."""
    def tally(credit: dict[str, int], seeders: list[str]) -> Tally:
        return Tally(learner="LA", seq=1, time=1.0, model_id="m", seeders=seeders, peers={
            p: Contribution(groups=n, rollouts=8 * n, tokens=0, first=1.0, last=1.0, models=["m"]) for p, n in credit.items()})
    checked = ["S1", "S2", "S3"]  # records that are mates' (`is_mate`): PRIVATE and GONE are not
    assert earned(checked, [tally({}, ["S2", "PRIVATE", "S1", "GONE"])], "LA") == ["S1", "S2"]
    many = [f"S{i:03d}" for i in range(MAX_SEEDERS)]
    first = earned([*reversed(many), "S1"], [tally({}, ["PRIVATE", *many])], "LA")
    assert first == many[:SEEDER_MATES]  # the first public ones in the learner's order, sorted
    assert earned(checked, [tally({"S3": 0}, ["S2"])], "LA") == ["S2"]  # an uncredited row changes nothing
    assert earned(checked, [tally({"S3": 1}, ["S1", "S2"])], "LA") == ["S3"]  # credit: seeders are done
    other = Tally(learner="LB", seq=1, time=1.0, model_id="m", peers={}, seeders=["S1"])
    assert earned(checked, [other], "LA") == []  # another learner's word names no one for ours
    assert seeders(None) == [] and seeders(tally({}, [])) == []


def test_the_records_a_sampler_reads_for_mates_are_of_the_samplers_credited_last():
    """A tally is cumulative: by credit, 128 long-gone samplers would keep a newcomer out for good."""
    def row(rollouts: int, last: float) -> Contribution:
        return Contribution(groups=1, rollouts=rollouts, tokens=0, first=0.0, last=last, models=["m"])
    tally = Tally(learner="LA", seq=1, time=1.0, model_id="m", peers={
        "GONE1": row(900, 10.0), "GONE2": row(800, 11.0), "NEW": row(8, 50.0), "NEWER": row(8, 60.0), "UNPAID": row(0, 70.0)})
    assert most_recent(tally, 2) == ["NEWER", "NEW"]  # uncredited rows are no one's mate
    assert most_recent(tally, 9) == ["NEWER", "NEW", "GONE2", "GONE1"] and most_recent(None, 3) == []


def test_a_sampler_follows_its_own_models_learner_and_feeds_those_that_name_its_model():
    peers = [learner("LA", "a", ["b"]), learner("LB", "b", ["a", "c"]), learner("LC", "c", []),
             learner("LA2", "a", ["b"]), sampler("s1", "b", "LB"), sampler("s2", "b", "LB", private=True),
             sampler("s3", "a", "LA")]
    trusted = {"LA": "a", "LB": "", "LC": "c", "LA2": "a"}
    c = choose(peers, trusted, "b")
    assert (c.follow, c.partners, c.mates) == ("LB", ["LA", "LA2"], ["s1"])  # LC does not take b; s2 is private
    a = choose(peers, trusted, "a")
    assert (a.follow, a.partners) == ("LA", ["LB"])  # the first of two learners of a; LA2 trains a too: no partner
    assert choose(peers, trusted, "c").follow == "LC" and choose(peers, trusted, "c").partners == ["LB"]
    assert c.models == ["a", "b", "c"]


def test_a_sampler_with_no_learner_of_its_model_only_feeds_partners():
    c = choose([learner("LA", "a", ["b"])], {"LA": ""}, "b")
    assert (c.follow, c.partners, c.mates) == (None, ["LA"], [])
    c = choose([learner("LA", "a", [])], {"LA": ""}, "b")
    assert (c.follow, c.partners, c.models) == (None, [], ["a"])  # nobody to send to: it waits, and says why


def test_impostors_and_disputed_learners_are_neither_followed_nor_fed():
    peers = [learner("LA", "a", ["b"]), learner("X", "b", ["a"]), learner("LB", "b", ["a"])]
    c = choose(peers, {"LA": "a", "LB": "c"}, "b")  # X: named by nobody; LB: the record says it trains c
    assert (c.follow, c.partners, c.disputed) == (None, ["LA"], ["LB"])
    assert choose(peers, {"LA": "a", "LB": "c"}, "a").partners == []


def test_peers_of_another_wire_protocol_are_neither_followed_fed_nor_mates_and_the_fix_is_said():
    old = msgspec.structs.replace(learner("LA", "a", ["b"]), protocol=PROTOCOL - 1)
    peers = [old, learner("LB", "b", ["a"]), sampler("S1", "b", "LB"),
             msgspec.structs.replace(sampler("S2", "b", "LB"), protocol=PROTOCOL + 1)]
    c = choose(peers, {"LA": "a", "LB": "b"}, "b")
    assert (c.follow, c.partners, c.mates, c.other_protocol) == ("LB", [], ["S1"], {"LA": PROTOCOL - 1})
    assert choose(peers, {}, "a", pin="LA").follow is None  # pinned, and still of no use to us
    assert swarm_model([], [msgspec.structs.replace(old, files="f")], pin="LA") is None
    assert "this hetero-node is older" in protocol_mismatch(PROTOCOL + 1)
    assert "the swarm runs an older hetero-node" in protocol_mismatch(PROTOCOL - 1)
    assert skipped_for_protocol({"LA": PROTOCOL - 1, "LB": PROTOCOL + 1}).startswith("the 2 learner(s) named")
    assert "this hetero-node is older" in skipped_for_protocol({"LA": PROTOCOL - 1, "LB": PROTOCOL + 1})  # the newest says


def test_a_pinned_learner_is_followed_whatever_its_model_and_nothing_else_is_fed():
    peers = [learner("LA", "a", ["b"]), learner("LB", "b", ["a"])]
    c = choose(peers, {"LA": "a", "LB": "b"}, "b", pin="LA")
    assert (c.follow, c.partners) == ("LA", [])
    assert choose(peers, {}, "b", pin="gone").follow is None


def test_takes_needs_the_model_named_and_never_counts_a_learners_own_model():
    assert takes(learner("L", "a", ["b"]), "b") and not takes(learner("L", "a", ["b"]), "c")
    assert not takes(learner("L", "a", ["*"]), "b")  # learners name models one by one
    assert not takes(learner("L", "b", ["b"]), "b")
    assert not takes(learner("L", "a"), "b")  # no field: nothing


def test_a_learner_invites_the_models_it_names_and_those_whose_tokenizers_it_holds():
    assert accepted_models(LearnerConfig()) == []  # "*" alone names nobody: an unnamed model in our tokenizer is audited as ours
    held = LearnerConfig(foreign=ForeignConfig(accept_models=("m/b", "*"), tokenizers={"m/c": "/tok", "m/d": "/tok-d"}))
    # m/c's tokenizer is another: "*" takes it as foreign; m/d's is our own: unnamed, it would be audited as ours
    assert accepted_models(held, {"m/c"}) == ["m/b", "m/c"]
    assert accepted_models(LearnerConfig(foreign=ForeignConfig(accept_models=("m/b",), tokenizers={"m/c": "/tok"})), {"m/c"}) == ["m/b"]
    assert accepted_models(LearnerConfig(foreign=ForeignConfig(accept_models=("m/b",)), foreign_loss="drop")) == []


# ---- the coordinator's list ---------------------------------------------------------------------

def test_learners_are_named_with_or_without_their_model_and_a_bad_entry_says_what_to_give(tmp_path):
    a, b, c = QM_A, QM_B, QM_C
    assert parse_learners([a, f"{b}=builtin:tiny-arith-b", f" {c} = m "]) == {a: "", b: "builtin:tiny-arith-b", c: "m"}
    for bad in ("", "=m", "Qm A", "x" * 65, "QmA", "Qm-typo", a[:-1], f"{a[:-1]}=m"):
        with pytest.raises(UserError, match="not a peer id") as e:
            parse_learners([bad])
        assert "PEER_ID=MODEL" in e.value.fix
    f = tmp_path / "learners.txt"
    f.write_text(f"# the swarm's learners\n{a}=m/a  # the first\n\n{b}\n")
    assert read_learners_file(f) == {a: "m/a", b: ""}
    with pytest.raises(UserError, match="cannot read"):
        read_learners_file(tmp_path)


# ---- the outbox: one copy stored, owed per learner -----------------------------------------------

def test_a_record_is_kept_once_until_every_learner_it_is_owed_to_settles_it(tmp_path):
    box = Outbox(tmp_path / "o.db")
    box.put("r1", b"one", to=(OWN, "LA", "LB"))
    box.put("r2", b"two", to=(OWN, "LA"))
    assert len(box) == 2 and (box.owed(), box.owed("LA"), box.owed("LB")) == (2, 2, 1)
    assert [r for r, _ in box.due(1 << 20, learner="LB")] == ["r1"]
    box.remove(["r1", "r2"])  # our learner took both
    assert len(box) == 2 and box.owed() == 0 and box.due(1 << 20) == []
    box.remove(["r1"], learner="LA")
    assert len(box) == 2  # r1 is still owed to LB
    box.remove(["r1"], learner="LB")
    assert len(box) == 1 and box.learners() == ["LA"]
    box.close()
    again = Outbox(tmp_path / "o.db")  # what was owed survives a restart (kill -9 included: WAL)
    assert [r for r, _ in again.due(1 << 20, learner="LA")] == ["r2"] and again.owed() == 0


def test_a_partners_copies_are_trimmed_to_the_newest_and_ours_are_untouched(tmp_path):
    box = Outbox(tmp_path / "o.db")
    for i in range(5):
        box.put(f"r{i}", b"x", to=(OWN, "LA"))
        time.sleep(0.002)  # distinct creation times
    assert box.trim("LA", 2) == 3
    assert [r for r, _ in box.due(1 << 20, learner="LA")] == ["r3", "r4"] and box.owed() == 5
    box.remove([f"r{i}" for i in range(5)])
    assert len(box) == 2  # the records only LA still needs
    assert box.trim("LA", 0) == 2 and len(box) == 0


def test_delayed_records_are_not_due_and_due_respects_the_byte_bound(tmp_path):
    box = Outbox(tmp_path / "o.db")
    box.put("late", b"x" * 10, delay_s=60, to=(OWN, "LA"))
    box.put("a", b"x" * 10, to=(OWN,))
    box.put("b", b"x" * 10, to=(OWN,))
    assert [r for r, _ in box.due(15)] == ["a"]  # at least one, then only what fits
    assert [r for r, _ in box.due(25)] == ["a", "b"] and box.due(1 << 20, learner="LA") == []
    assert box.owed_ids() == {"late", "a", "b"} and box.owed_ids("LA") == {"late"}  # delayed ones are owed too


def test_an_outbox_from_before_several_learners_keeps_its_records_for_the_followed_learner(tmp_path):
    db = sqlite3.connect(tmp_path / "o.db")
    db.execute("CREATE TABLE outbox (id TEXT PRIMARY KEY, data BLOB NOT NULL, created REAL NOT NULL, "
               "not_before REAL NOT NULL)")
    db.executemany("INSERT INTO outbox VALUES (?, ?, ?, ?)", [("r1", b"one", 1.0, 1.0), ("r2", b"two", 2.0, 2.0)])
    db.commit()
    db.close()
    box = Outbox(tmp_path / "o.db")
    assert box.due(1 << 20) == [("r1", b"one"), ("r2", b"two")] and box.learners() == [OWN]


def test_a_running_bootstrap_picks_up_learners_added_to_its_file_and_keeps_the_last_good_list(tmp_path, caplog):
    from cli.roles import LearnersFile

    f = tmp_path / "learners.txt"
    read = LearnersFile(f).read
    a, b = QM_A, QM_B
    assert read() == {}  # not there yet: nobody
    f.write_text(f"{a}=m/a\n")
    assert read() == {a: "m/a"}
    f.write_text(f"{a}=m/a\n{b}=m/b\n")  # the coordinator adds a learner while the swarm runs
    assert read() == {a: "m/a", b: "m/b"}
    f.write_text(f"{a}=m/a\n{b[:-1]}=m/b\n")  # a typo: the swarm keeps the learners it had
    assert read() == {a: "m/a", b: "m/b"}
    assert "keeping the learners it named before" in caplog.text
    f.write_text("")
    assert read() == {}  # emptied on purpose: nobody
    assert LearnersFile(None).read() == {}
