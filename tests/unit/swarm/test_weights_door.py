"""The chunk door's handler (hetero.chunks.v2, swarm/weights/chunks.py) answering by hand, no
network: a stream ends at the first chunk not held and each index named is charged first, a download
in progress answers its gaps up to a bound, and a malformed request or broken frame costs a call and
a tarpit and is counted. The same door against a stranger flooding it over the real protocol:
tests/integration/swarm/test_weights_door_wire.py."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import msgpack
import pytest

from helpers.clock import Clock
from swarm.p2p import Doors
from swarm.p2p.doors import DOORS, Bound
from swarm.p2p.handlers import BoundedStream
from swarm.weights import ChunkStore
from swarm.weights.chunks import INDEX_COST
from swarm.wire.chunks import CHUNK_SIZE, CHUNKS, MAX_INDICES, MAX_REQUEST_BYTES, MAX_REQUEST_WAIT, MIN_CHUNK, ChunkRequest


class _Node:
    """A SwarmNode as a ChunkStore sees it: doors, and where its handler is registered."""

    def __init__(self) -> None:
        self.doors, self.handler = Doors(clock=Clock()), None  # a stopped clock: no bucket refills

    def add_stream_handler(self, name, handler, **kw) -> None:
        self.handler = handler


def _store() -> tuple[ChunkStore, _Node, list[str]]:
    node, tarpitted = _Node(), []
    store = ChunkStore(node)

    async def tarpit(peer: str, why: str = "calls", nbytes: int = 0) -> None:  # the door's 1 s, not waited here
        tarpitted.append(why)
    store._door.tarpit = tarpit
    return store, node, tarpitted


def _ask(node: _Node, payload: bytes, peer: str = "peer") -> list[bytes]:
    async def collect() -> list[bytes]:
        return [bytes(item) async for item in node.handler(payload, peer)]
    return asyncio.run(collect())


def test_a_stream_ends_at_the_first_chunk_not_held_and_each_index_named_is_charged_first():
    store, node, tarpitted = _store()
    assert isinstance(node.handler, BoundedStream) and node.handler.max_request == MAX_REQUEST_BYTES
    blob = os.urandom(2 * MIN_CHUNK + 5)  # 3 chunks (of MIN_CHUNK: `chunk_size`)
    store.put("c", 0, blob)
    door = node.doors._doors[CHUNKS]
    first_two = [blob[:MIN_CHUNK], blob[MIN_CHUNK:2 * MIN_CHUNK]]
    assert _ask(node, ChunkRequest("c", 0, [0, 1, 7, 2], 0.0).encode()) == first_two  # 7 not held: the end
    assert door.served == 4 * INDEX_COST + 2 * MIN_CHUNK
    # the most a request may name, of a version not held: no frame at all, every index charged
    assert _ask(node, ChunkRequest("c", 9, list(range(MAX_INDICES)), 0.0).encode(), "other") == []
    assert door.served == 4 * INDEX_COST + 2 * MIN_CHUNK + MAX_INDICES * INDEX_COST and tarpitted == []
    # past the door: tarpitted, then no frame at all (before: one b"" per index named)
    for _ in range(int(DOORS[CHUNKS].call_burst)):
        door.enter("flood")
    assert _ask(node, ChunkRequest("c", 0, list(range(MAX_INDICES)), 0.0).encode(), "flood") == []
    assert tarpitted == ["calls"] and store.malformed == 0


def test_a_download_in_progress_answers_its_gaps_with_empty_frames_up_to_a_bound():
    from swarm.weights.chunks import MAX_GAPS

    store, node, _ = _store()
    store.begin("c", 3)
    for i in (0, 2, MAX_GAPS + 3):
        store.add_chunk("c", 3, i, bytes([i]))
    # a mate mid-download: the chunk after a gap is still worth taking from it
    assert _ask(node, ChunkRequest("c", 3, [0, 1, 2], 0.0).encode()) == [b"\x00", b"", b"\x02"]
    # but no more than MAX_GAPS empty frames a call: chunk MAX_GAPS + 3 sits past MAX_GAPS + 1 gaps
    got = _ask(node, ChunkRequest("c", 3, list(range(1, MAX_GAPS + 4)), 0.0).encode(), "other")
    assert got == [b""] + [b"\x02"] + [b""] * (MAX_GAPS - 1)


@pytest.mark.parametrize("payload, why", [pytest.param(p, why, id=why) for p, why in [
    (b"\xc1", "undecodable"), (msgpack.packb(["c", "zero", [0], 0.0]), "schema"),
    (msgpack.packb(["c", 0, [0] * (1 << 17), 0.0]), "too_many"),
    (msgpack.packb(["c", 0, list(range(1 << 17)), 0.0]), "oversize"),  # (the node's frame bound refuses it first)
]])
def test_a_malformed_request_costs_a_call_and_a_tarpit_and_is_counted(payload, why):
    store, node, tarpitted = _store()
    store.put("c", 0, bytes(CHUNK_SIZE))
    door = node.doors._doors[CHUNKS]
    assert _ask(node, payload) == [] and store.malformed_why == {why: 1} and tarpitted == ["calls"]
    assert door.left(Bound.CALLS, "peer") == DOORS[CHUNKS].call_burst - 1  # its call taken before decoding
    assert door.served == INDEX_COST * min(len(payload), MAX_INDICES)  # what it could have named


def test_a_broken_request_frame_costs_a_call_and_a_tarpit_and_is_counted():
    store, node, tarpitted = _store()
    asyncio.run(node.handler.refused("peer", "RemoteError: a frame of 3000000 bytes, over the 143283 allowed"))
    assert store.malformed_why == {"frame": 1} and tarpitted == ["calls"]
    assert node.doors._doors[CHUNKS].left(Bound.CALLS, "peer") == DOORS[CHUNKS].call_burst - 1


def test_a_mate_waits_for_each_chunk_of_a_request_from_the_last_it_served():
    # on a slow link an owner's chunks come from the learner seconds apart: a deadline for the whole
    # request answered the later ones as gaps, and they went to the learner
    store, node, _ = _store()
    store.begin("c", 3)

    # each chunk waited for at most 2 s. Sleeps only run late, never early: chunk 1 comes at least 2.1 s
    # after the request (past a whole-request deadline of 2 s) and is late for its own 2 s only if the
    # 1.1 s sleep overruns by 0.9 s; chunk 0 only if the 1 s sleep overruns by 1 s
    async def collect() -> list[bytes]:
        async def arrive() -> None:
            await asyncio.sleep(1.0)
            store.add_chunk("c", 3, 0, b"\x00")
            await asyncio.sleep(1.1)
            store.add_chunk("c", 3, 1, b"\x01")
        task = asyncio.create_task(arrive())
        got = [bytes(item) async for item in node.handler(ChunkRequest("c", 3, [0, 1, 2], 2.0).encode(), "peer")]
        await task
        return got
    # chunk 1 came within 2 s of chunk 0 being served; chunk 2 never did: a gap after 2 s, the end
    assert asyncio.run(collect()) == [b"\x00", b"\x01", b""]


@pytest.mark.parametrize("change", ["arrives", "abandoned"])
def test_a_request_waiting_for_a_chunk_is_woken_by_the_change_not_a_poll(change):
    # a sampler holds dozens of such requests while a version spreads; each looked its chunk up every
    # 10 ms. Now it looks before it waits, once more at its first wait in a loop (a change made
    # before the store knew the loop woke no one), and once when the change comes, from the
    # fetcher's thread as in a sampler (a poll: ~20 lookups in the 0.2 s)
    store, node, _ = _store()
    store.begin("c", 3)
    lookups, lookup, woken, next_change = [], store._lookup, [], store._changes.wait
    store._lookup = lambda *a: lookups.append(a) or lookup(*a)
    # woken by the change: its wait returned True (False: its time ran out), and the wake ran in the
    # loop's thread (here the test's, asyncio.run's), handed over by call_soon_threadsafe. (An event
    # set straight from the writer's thread also reads as set, but only once the loop next looks)
    wakes, wake = [], store._changes._wake
    store._changes._wake = lambda: wakes.append(threading.get_ident()) or wake()

    async def waits(timeout: float) -> bool:
        woken.append(await next_change(timeout))
        return woken[-1]
    store._changes.wait = waits

    def later() -> None:
        time.sleep(0.2)
        store.add_chunk("c", 3, 0, b"\x00") if change == "arrives" else store.abandon(3)
    thread = threading.Thread(target=later)
    thread.start()
    got = _ask(node, ChunkRequest("c", 3, [0], MAX_REQUEST_WAIT).encode())
    thread.join()
    assert got == ([b"\x00"] if change == "arrives" else []) and len(lookups) <= 3
    assert woken and False not in woken and wakes and set(wakes) == {threading.get_ident()}


def test_the_first_peers_served_the_seed_version_whole_are_its_seeders_fixed_until_the_next():
    from swarm.wire.tally import MAX_SEEDERS
    store, node, _ = _store()
    blob, patch = os.urandom(2 * MIN_CHUNK + 5), os.urandom(10)  # 3 chunks; 1
    store.put("c", 0, blob)
    store.put("c", 1, patch)
    _ask(node, ChunkRequest("c", 0, [0, 1, 2], 0.0).encode(), "SAMPLER")
    assert store.seeders() == []  # no seed version named (a sampler's store): no one is a seeder
    store.seed_from(0)
    _ask(node, ChunkRequest("c", 1, [0], 0.0).encode(), "PATCH")
    assert store.seeders() == []  # a patch taken whole is not the keyframe
    _ask(node, ChunkRequest("c", 0, [0, 1], 0.0).encode(), "A")
    _ask(node, ChunkRequest("c", 0, [1], 0.0).encode(), "A")
    assert store.seeders() == []  # two of three chunks, one of them twice: not whole
    _ask(node, ChunkRequest("c", 0, [2], 0.0).encode(), "A")
    assert store.seeders() == ["A"]  # every chunk, over three requests
    _ask(node, ChunkRequest("c", 0, [0, 1, 2], 0.0).encode(), "B")
    _ask(node, ChunkRequest("c", 0, [2], 0.0).encode(), "A")  # a repeat changes nothing
    assert store.seeders() == ["A", "B"]
    store.put("c", 2, b"k")  # the next keyframe (one chunk: the door's pool of strangers' bytes is not refilled here)
    store.seed_from(2)
    assert store.seeders() == []  # its own first takers
    for k in range(MAX_SEEDERS + 2):
        _ask(node, ChunkRequest("c", 2, [0], 0.0).encode(), f"S{k}")
    assert store.seeders() == [f"S{k}" for k in range(MAX_SEEDERS)]  # the first, fixed
    store.reset("d")
    assert store.seed_version is None and store.seeders() == []
