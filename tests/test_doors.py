"""The doors of a node against a stranger with its own fresh key (issue 39), over the real protocol:
a real learner process at a volunteer's default open-file limit, and in-process hivemind peers on
127.0.0.1 for the weight doors (manifests and chunks)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import PeerID

from helpers.swarmkit import Swarm, peer_of, start_bootstrap
from helpers.sybils import learner_maddrs
from swarm.dht import NetworkConfig
from swarm.exchange import WeightVersion
from swarm.identity import Identity
from swarm.p2p import SwarmNode
from swarm.p2p.doors import TARPIT_S
from swarm.rollouts import ROLLOUTS
from swarm.weights import CHUNK_SIZE, ChunkRequest, WeightServer
from swarm.weights.chunks import CHUNKS, CHUNKS_BUDGET, MAX_REPEATS
from swarm.weights.manifest import MANIFEST
from swarm.weights.server import MANIFEST_BUDGET

ROOT = Path(__file__).resolve().parents[1]
LEARNER_TOML = "[learner]\ncheckpoint_every = 10\neval_every = 0\nmax_staleness = 1000\ngroups_per_step = 4\n"
NOFILE = 1024


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.mark.integration
def test_1500_idle_streams_from_one_key_cannot_exhaust_a_learners_descriptors(tmp_path):
    """Before: the learner's descriptors went 23 -> 1,023, accept() failed and the learner exited.
    Now its stream budget closes every stream of that key past 16 unread: its descriptors stay far
    below the limit, it keeps training on the honest sampler's groups, and it says what it refused."""
    s = Swarm(tmp_path)
    try:
        start_bootstrap(s)
        learner = s.start_learner(LEARNER_TOML, nofile=NOFILE)
        s.join("honest", "sampler", "--name", "honest")
        s.wait_version(2, timeout=240)
        maddrs = learner_maddrs(s.status(), peer_of(s, "learner"))
        attack = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "tests.helpers.idle_streams", str(tmp_path / "attacker.key"),
             ROLLOUTS, "1500", "20", *maddrs], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        peak, deadline = 0, time.monotonic() + 240
        while attack.poll() is None and time.monotonic() < deadline:
            peak = max(peak, _fds(learner.popen.pid))
            time.sleep(0.2)
        out, _ = attack.communicate(timeout=60)
        seen = json.loads(out.strip().splitlines()[-1])
        print(f"\nidle streams: {seen}, learner's peak descriptors {peak} at a limit of {NOFILE}")
        assert seen["opened"] + seen["failed"] == 1500 and seen["opened"] >= 1000, seen
        assert seen["closed_by_peer"] >= seen["opened"] - 16, seen  # all but its 16 closed unread
        assert learner.popen.poll() is None, "the learner died"
        assert peak < NOFILE // 2, f"the learner held {peak} descriptors at a limit of {NOFILE}"
        before = s.version()
        s.wait_version(before + 2, timeout=180)  # and it goes on training
        log = (s.logs / "learner.log").read_text()
        assert "refused a stream of" in log and "past the peer bound" in log
        assert "Too many open files" not in log
    finally:
        s.stop_all()


@pytest.fixture
def weight_door(tmp_path):
    """A learner's weight server holding a 4-chunk keyframe, and two strangers with fresh keys."""
    server = SwarmNode(Identity.load_or_create(tmp_path / "l.key"), NetworkConfig(), "doors")
    strangers = [SwarmNode(Identity.load_or_create(tmp_path / f"a{i}.key"), NetworkConfig(initial_peers=server.maddrs()),
                           "doors") for i in range(2)]
    ws = WeightServer(server)
    blob = os.urandom(4 * CHUNK_SIZE)
    ws.publish(WeightVersion("m", "chain", 0, None, blob))
    try:
        yield ws, strangers, blob
    finally:
        for n in [*strangers, server]:
            n.shutdown()


@pytest.mark.integration
def test_one_key_asking_manifests_32_at_a_time_gets_its_budget_and_empty_replies(weight_door):
    """Before: 2,249 sealed replies/s to one key, 0.92 of the learner's core. Now its budget."""
    ws, (attacker, _), _ = weight_door
    target = PeerID.from_base58(ws.node.peer_id)
    seconds, got = 4.0, []

    async def flood() -> None:
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                reply = await attacker.p2p.call_protobuf_handler(target, MANIFEST, BytesValue(value=b""), BytesValue)
                got.append(len(reply.value))
        await asyncio.gather(*(worker() for _ in range(32)))
    t0 = time.monotonic()
    attacker.run(flood(), timeout=seconds + 30)
    elapsed = time.monotonic() - t0
    sealed = sum(n > 0 for n in got)
    print(f"\nmanifest flood: {len(got)} calls in {elapsed:.1f} s ({len(got) / elapsed:.0f}/s), {sealed} sealed replies, "
          f"door {ws.node.doors.stats()[MANIFEST]}")
    assert sealed <= MANIFEST_BUDGET.call_burst + MANIFEST_BUDGET.calls_per_s * elapsed + 1
    assert len(got) <= 32 * (elapsed / TARPIT_S + 1) + sealed  # each refusal held: 32 in flight, ~32 calls/s
    assert ws.stats["busy"] == len(got) - sealed > 0 and ws.node.doors.stats()[MANIFEST]["calls"] == ws.stats["busy"]


def _stream(node: SwarmNode, server: str, indices: list[int]) -> int:
    """Bytes of real chunks one chunk request got."""
    got = []
    node.call_stream(server, CHUNKS, ChunkRequest("chain", 0, indices, 0.0).encode(), 30, lambda item: got.append(len(item)))
    return sum(got)


@pytest.mark.integration
def test_one_key_asking_the_keyframe_again_and_again_is_served_it_a_bounded_number_of_times(weight_door):
    """Before: 8 streams of one key drew 5.39 GB in 30 s from the learner. Now each chunk of a
    version goes to one peer at most MAX_REPEATS times; another fresh key still gets it whole."""
    ws, (attacker, newcomer), blob = weight_door
    served, stop = [], time.monotonic() + 6.0

    def ask() -> None:
        while time.monotonic() < stop:
            served.append(_stream(attacker, ws.node.peer_id, [0, 1, 2, 3]))
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    print(f"\nkeyframe repeats: {len(served)} requests, {sum(served) / 2**20:.0f} MiB served "
          f"(without the bound: {len(served) * len(blob) / 2**20:.0f} MiB), {ws.store.repeats_refused} chunks refused")
    assert sum(served) == MAX_REPEATS * len(blob)
    assert ws.store.repeats_refused > 0 and ws.node.doors.stats()[CHUNKS]["calls"] > 0  # refused and counted
    assert _stream(newcomer, ws.node.peer_id, [0, 1, 2, 3]) == len(blob)  # its own count, the pool ample
    assert len(blob) * (MAX_REPEATS + 1) < CHUNKS_BUDGET.pool_byte_burst
