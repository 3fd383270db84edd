"""swarm/p2p/budget.py: the inbound streams a peer, and all peers, may hold open; the open-file limit.

Unit tests here; tests/test_doors.py sends 1,500 idle streams from one key to a real learner
running at a 1,024 open-file limit."""

from __future__ import annotations

import resource
import subprocess
import sys

from swarm.p2p.budget import MIN_TOTAL, RESERVED_FDS, StreamBudget, total_for


def test_a_peer_past_its_streams_on_one_protocol_is_refused_and_counted_others_are_not():
    b = StreamBudget(per_peer=2, total=10)
    with b.hold("a", "p") as one, b.hold("a", "p") as two, b.hold("a", "p") as three:
        assert (one, two, three) == (True, True, False)
        with b.hold("a", "q") as other_protocol, b.hold("b", "p") as other_peer:
            assert other_protocol and other_peer and b.open == 4
    assert b.open == 0 and b.refused == {"peer": 1}
    with b.hold("a", "p") as again:  # a closed stream gives its slot back
        assert again


def test_all_peers_together_hold_at_most_the_total_however_many_keys_they_have():
    b = StreamBudget(per_peer=16, total=3, trusted=lambda peer: True)
    held = [b.hold(f"key{i}", "p") for i in range(5)]
    admitted = [h.__enter__() for h in held]
    assert admitted == [True, True, True, False, False] and b.refused == {"total": 2}
    for h in reversed(held):
        h.__exit__(None, None, None)
    assert b.open == 0


def test_fresh_keys_hold_at_most_half_the_total_and_known_peers_find_the_rest_free():
    b = StreamBudget(per_peer=16, total=8, trusted=lambda peer: peer.startswith("proven"))
    fresh = [b.hold(f"fresh{i}", "p") for i in range(10)]
    assert [h.__enter__() for h in fresh] == [True] * 4 + [False] * 6 and b.refused == {"pool": 6}
    known = [b.hold(f"proven{i}", "p") for i in range(5)]
    assert [h.__enter__() for h in known] == [True] * 4 + [False] and b.refused == {"pool": 6, "total": 1}
    for h in [*known[:4], *fresh[:4]]:
        h.__exit__(None, None, None)
    assert b.open == 0


def test_the_total_is_half_of_what_the_open_file_limit_leaves_after_the_nodes_own():
    assert RESERVED_FDS == 256 and total_for(1024) == (1024 - 256) // 2 == 384
    assert total_for(65536) == 32640 and total_for(300) == MIN_TOTAL  # a tiny limit still serves someone


def test_a_node_raises_its_soft_open_file_limit_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, hard, 512)
    code = ("import resource; from swarm.p2p.budget import raise_nofile_limit; "
            "print(*raise_nofile_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[1])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)))
    before, after, child_hard = map(int, out.stdout.split())
    assert (before, child_hard) == (low, hard)
    assert after == hard or hard == resource.RLIM_INFINITY, out
