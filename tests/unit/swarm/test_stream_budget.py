"""swarm/p2p/budget.py: the inbound streams a peer, and all peers, may hold open; the open-file limit;
and doors.py: how long a call past a budget waits, budgets that follow what they guard.

Unit tests here; tests/integration/swarm/test_doors.py sends 1,500 idle streams from one key to a
real learner running at a 1,024 open-file limit."""

from __future__ import annotations

import resource
import subprocess
import sys

from swarm.p2p.budget import MIN_TOTAL, RESERVED_FDS, StreamBudget, total_for
from swarm.p2p.doors import TARPIT_MAX_S, TARPIT_S, Door, DoorBudget, Doors
from swarm.wire.chunks import CHUNK_SIZE, CHUNKS
from swarm.p2p.doors import DOORS, MiB
from swarm.weights.chunks import ChunkStore
from helpers.clock import Clock


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
    b = StreamBudget(per_peer=16, total=3, proven=lambda peer: True)
    held = [b.hold(f"key{i}", "p") for i in range(5)]
    admitted = [h.__enter__() for h in held]
    assert admitted == [True, True, True, False, False] and b.refused == {"total": 2}
    for h in reversed(held):
        h.__exit__(None, None, None)
    assert b.open == 0


def test_fresh_keys_hold_at_most_half_the_total_and_known_peers_find_the_rest_free():
    b = StreamBudget(per_peer=16, total=8, proven=lambda peer: peer.startswith("proven"))
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


# ---- doors.py: what a call past a door's budget waits, and budgets that follow what they guard ----


def test_a_refused_call_waits_until_its_bound_refills_at_least_the_floor_at_most_the_cap():
    clock = Clock()
    door = Door("d", DoorBudget(calls_per_s=0.25, call_burst=2, bytes_per_s=64 * MiB, byte_burst=2048 * MiB,
                                unproven_calls_per_s=1.0, unproven_call_burst=1), lambda peer: peer == "known", clock=clock)
    assert door.enter("known") is None and door.enter("known") is None
    assert door.enter("known") == "calls"
    assert door.refill_s("known", "calls") == 4.0 and door.tarpit_s("known", "calls") == 4.0  # 1 call at 0.25/s
    clock.t = 3.0
    assert door.refill_s("known", "calls") == 1.0
    assert door.enter("fresh") is None and door.enter("other") == "unproven_calls"  # the pool held one call
    assert door.refill_s("other", "unproven_calls") == 1.0
    clock.t = 3.5
    assert door.refill_s("other", "unproven_calls") == 0.5 and door.tarpit_s("other", "unproven_calls") == TARPIT_S
    door.charge("known", 4096 * MiB)  # 2 GiB into debt at 64 MiB/s: 32 s to pay back, held the cap
    assert door.allows("known", 1) == "bytes" and door.refill_s("known", "bytes") > 32.0
    assert door.tarpit_s("known", "bytes") == TARPIT_MAX_S
    assert door.refused == {"calls": 1, "unproven_calls": 1, "bytes": 1}


def test_a_chunk_doors_byte_bursts_grow_to_the_largest_version_it_holds():
    """A peer may take a whole version at its line rate, whatever the model's size: a 15 GB 7B
    keyframe is served in one burst, not 2 GiB and then the rate (the burst before: a constant)."""
    clock = Clock()
    door = Door("chunks", DOORS[CHUNKS], lambda peer: False, clock=clock)
    keyframe = 15 * 10 ** 9
    door.resize(byte_burst=keyframe, unproven_byte_burst=keyframe)
    served = 0
    while door.allows("newcomer", CHUNK_SIZE) is None and served < 2 * keyframe:
        door.charge("newcomer", CHUNK_SIZE)
        served += CHUNK_SIZE
    assert keyframe <= served < keyframe + CHUNK_SIZE  # all of it at once, then the rate
    clock.t = 1.0
    assert door.allows("newcomer", CHUNK_SIZE) is None  # a second later the pool's rate lets a chunk in


def test_a_chunk_store_sizes_its_door_by_what_it_holds():
    node = type("Node", (), {"doors": Doors(clock=Clock()), "add_stream_handler": lambda *a, **k: None})()
    store = ChunkStore(node)
    door = node.doors._doors[CHUNKS]
    assert door.budget.byte_burst == DOORS[CHUNKS].byte_burst == 64 * MiB
    store.put("c", 0, bytes(100 * MiB))
    assert door.budget.byte_burst == 100 * MiB and door.budget.unproven_byte_burst == 2 * 100 * MiB  # NEWCOMERS_AT_ONCE
    # fresh keys joining together (the clock stopped: no refill) each take it whole, chunk by chunk
    for newcomer in ("fresh0", "fresh1"):
        for _ in range(100 * MiB // CHUNK_SIZE):
            assert door.allows(newcomer, CHUNK_SIZE) is None, newcomer
            door.charge(newcomer, CHUNK_SIZE)
    assert door.allows("a third", CHUNK_SIZE) == "unproven_bytes"  # past them, the pool's rate
    store.put("c", 1, bytes(MiB))  # a patch does not shrink it: the keyframe may still be asked
    assert door.budget.byte_burst == 100 * MiB
