"""The learner's credit books stay bounded whatever the number of keys (keys are free): the tally it
keeps (`MAX_KEPT` samplers, the least recently credited folded into `forgotten`), the groups it
counts per sampler, and the per-sampler dicts of every step's metrics (`METRICS_PEERS`, the rest summed).
What a published tally holds, and that it validates and the leaderboard counts it:
tests/unit/swarm/test_dht_validators.py.

Unit tests (fast)."""

from __future__ import annotations

from swarm.wire.peer import as_value

import json

from node.learner.credit import MAX_KEPT, Credit
from node.learner.books import METRICS_PEERS, Books


def test_the_kept_tally_forgets_the_least_recently_credited_past_its_bound_and_keeps_their_sums():
    t = Credit()
    for i in range(MAX_KEPT):
        t.credit(f"s{i}", 8, 100, "m", now=float(i))
    t.credit("s3", 8, 100, "m", now=float(MAX_KEPT))  # credited again: now the newest
    for i in range(10):
        t.credit(f"new{i}", 8, 100, "m", now=float(MAX_KEPT + 1 + i))
    n = MAX_KEPT + 10  # keys credited, s3 twice
    assert len(t.peers) == MAX_KEPT and "s3" in t.peers and "new9" in t.peers
    gone = [f"s{i}" for i in range(11) if i != 3]  # the 10 least recently credited
    assert not any(p in t.peers for p in gone) and "s11" in t.peers
    assert t.forgotten == {"count": 10, "groups": 10, "rollouts": 80, "tokens": 1000}
    value = as_value(t.tally("L", "m"))
    assert value["others"]["count"] == n - len(value["peers"])  # the forgotten count in the totals
    assert sum(c["rollouts"] for c in value["peers"].values()) + value["others"]["rollouts"] == 8 * (n + 1)
    # through a checkpoint (JSON), and one from before the bound is trimmed on load
    again = Credit(**json.loads(json.dumps({"peers": t.peers, "seq": t.seq, "forgotten": t.forgotten})))
    assert list(again.peers) == list(t.peers) and again.forgotten == t.forgotten
    older = Credit(**json.loads(json.dumps({"peers": {**{"x": t.peers["s11"]}, **t.peers}, "seq": 1})))
    assert len(older.peers) == MAX_KEPT and "x" not in older.peers and older.forgotten["count"] == 1


def test_books_count_every_sampler_but_keep_and_report_a_bounded_number_of_them():
    books = Books()
    for i in range(MAX_KEPT + 5):
        books.count_accepted(f"s{i}", 1 + i % 3)
        books.credit.credit(f"s{i}", 8, 100, "m")
    books.count_accepted("s7")  # trained on again: now the newest
    for j in range(3):
        books.count_accepted(f"late{j}")  # s5, s6 and s8 forgotten, not s7
    total = sum(1 + i % 3 for i in range(MAX_KEPT + 5)) + 4
    assert len(books.accepted_by_sampler) == MAX_KEPT and books.accepted_others["samplers"] == 8
    assert "s7" in books.accepted_by_sampler and not {"s6", "s8"} & set(books.accepted_by_sampler)
    assert books.trained() == total
    c = books.counters()
    assert len(c["accepted_by_sampler"]) == METRICS_PEERS and len(c["credited"]) == METRICS_PEERS
    assert sum(c["accepted_by_sampler"].values()) + c["accepted_others"]["groups"] == total
    assert c["accepted_others"]["samplers"] == MAX_KEPT + 8 - METRICS_PEERS  # the 8 forgotten included
    assert c["credited_others"] == {"samplers": MAX_KEPT + 5 - METRICS_PEERS, "groups": MAX_KEPT + 5 - METRICS_PEERS}
    assert min(c["accepted_by_sampler"].values()) == 3  # the most trained on are the ones named
    assert len(json.dumps(c)) < 5000  # a step's line, whatever the number of keys
    state = json.loads(json.dumps(books.state_dict()))
    again = Books()
    again.load_state_dict(state)
    assert again.trained() == total and again.counters() == c


def test_a_small_swarms_books_and_tally_read_as_before():
    books = Books()
    books.accepted_by_sampler.update({"a": 3, "b": 1})
    books.credit.credit("a", 8, 40, "m")
    c = books.counters()
    assert c["accepted_by_sampler"] == {"a": 3, "b": 1} and c["credited"] == {"a": 1}
    assert c["accepted_others"] == {"samplers": 0, "groups": 0} == c["credited_others"]
    assert "others" not in as_value(books.credit.tally("L", "m"))  # what peers from before `others` accept
    old = {"drops": {}, "accepted_by_sampler": {"a": 3},
           "tally": {"peers": books.credit.peers, "seq": 4}, "reward_claim_mismatch": 0, "version_clamped": 0}
    books.load_state_dict(json.loads(json.dumps(old)))  # a checkpoint from before the bounds
    assert books.trained() == 3 and books.credit.forgotten["count"] == 0


def test_a_tally_whose_entries_are_far_over_their_budget_names_fewer_and_still_fits():
    from hivemind.utils import MSGPackSerializer

    from node.learner.credit import MAX_PUBLISHED
    from swarm.wire.tally import TALLY_BYTES
    t = Credit()
    for i in range(3000):
        t.credit(f"QmSybil{i:039d}", 8, 100, "m" * 400 + str(i % 3))  # ~520 bytes an entry, not 256
        t.credit(f"QmSybil{i:039d}", 8, 100, "m" * 400)
    value = as_value(t.tally("L", "m"))
    assert len(MSGPackSerializer.dumps(value)) <= TALLY_BYTES and 0 < len(value["peers"]) < MAX_PUBLISHED
    assert len(value["peers"]) + value["others"]["count"] == 3000


def test_a_tally_names_the_seeders_the_learner_has_not_credited_at_most_max_seeders():
    from swarm.wire.tally import MAX_SEEDERS
    t = Credit()
    assert "seeders" not in as_value(t.tally("L", "m"))  # none: absent, as peers from before them expect
    t.credit("S1", 8, 100, "m")
    named = t.tally("L", "m", seeders=["S2", "S1", "L", *(f"X{i}" for i in range(2 * MAX_SEEDERS))]).seeders
    assert named == ["S2", *(f"X{i}" for i in range(MAX_SEEDERS - 1))]  # S1 credited, L itself: left out
