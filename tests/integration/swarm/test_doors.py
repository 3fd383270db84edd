"""The doors of a node against a stranger with its own fresh key (issue 39), over the real protocol:
a real learner process at a volunteer's default open-file limit, and in-process hivemind peers on
127.0.0.1 for the weight doors (manifests and chunks)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from google.protobuf.wrappers_pb2 import BytesValue
from hivemind.p2p import PeerID

from helpers.swarmkit import Swarm, flood_rates, peer_of, start_bootstrap
from helpers.fake_records import make_keys
from helpers.repo import ROOT
from helpers.sybils import learner_maddrs
from node.models import BUILTIN_MODEL
from swarm.dht.network import NetworkConfig
from swarm.exchange import WeightVersion
from swarm.identity import Identity
from swarm.p2p import SwarmNode
from swarm.p2p.doors import TARPIT_S
from swarm.wire.batch import ROLLOUTS
from swarm.wire.chunks import CHUNK_SIZE, ChunkRequest, split_blob
from swarm.weights import WeightServer
from swarm.wire.chunks import CHUNKS
from swarm.p2p.doors import DOORS
from swarm.weights.chunks import MAX_REPEATS
from swarm.wire.manifest import MANIFEST, ManifestRequest

LEARNER_TOML = "[learner]\ncheckpoint = { every = 10 }\neval_every = 0\nmax_staleness = 1000\ngroups_per_step = 4\n"
NOFILE = 1024


def _kill_group(proc: subprocess.Popen | None) -> None:
    """An attacker started with start_new_session=True, and every process it made: killing the
    parent alone left the fake_records helper's forked DHT process running after the test."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_1500_idle_streams_from_one_key_cannot_exhaust_a_learners_descriptors(tmp_path):
    """Before: the learner's descriptors went 23 -> 1,023, accept() failed and the learner exited.
    Now its stream budget closes every stream of that key past 16 unread: its descriptors stay far
    below the limit, it keeps training on the honest sampler's groups, and it says what it refused."""
    s = Swarm(tmp_path)
    attack = None
    try:
        start_bootstrap(s)
        learner = s.start_learner(LEARNER_TOML, nofile=NOFILE)
        s.join("honest", "sampler", "--name", "honest")
        s.wait_version(2, timeout=240)
        maddrs = learner_maddrs(s.status(), peer_of(s, "learner"))
        attack = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "tests.helpers.idle_streams", str(tmp_path / "attacker.key"),
             ROLLOUTS, "1500", "20", *maddrs], cwd=ROOT, stdout=subprocess.PIPE, text=True,
            start_new_session=True)  # its own group: its p2p daemon goes with it (_kill_group)
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
        _kill_group(attack)
        s.stop_all()


@pytest.fixture
def weight_door(tmp_path):
    """A learner's weight server holding a 4 MiB keyframe (64 chunks of 64 KiB: `chunk_size`), and two strangers with fresh keys."""
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
    assert sealed <= DOORS[MANIFEST].call_burst + DOORS[MANIFEST].calls_per_s * elapsed + 1
    assert len(got) <= 32 * (elapsed / TARPIT_S + 1) + sealed  # each refusal held: 32 in flight, ~32 calls/s
    assert ws.stats["busy"] == len(got) - sealed > 0 and ws.node.doors.stats()[MANIFEST]["calls"] == ws.stats["busy"]


def test_fresh_keys_holding_long_polls_leave_half_the_slots_to_the_proven(weight_door):
    """300 keys each holding a long poll could not be run here (each attacker's p2pd takes 55-75 MB),
    so the slots are scaled down to 2: one fresh key holds its long poll, a second fresh key is
    answered at once (keys the node does not know hold at most half), and a key the learner has
    proven still waits for the next version. Each held poll is a task and its request (no stream)."""
    ws, (attacker, proven), _ = weight_door
    ws.MAX_WAITERS = 2
    ws.node.doors.set_proven(lambda peer: peer == proven.peer_id)
    ask = ManifestRequest("chain", 0, 5.0).encode()

    def timed(node: SwarmNode) -> float:
        t0 = time.monotonic()
        assert node.call(ws.node.peer_id, MANIFEST, ask, 20.0) == b""  # nothing newer, waited for or not
        return time.monotonic() - t0
    held = threading.Thread(target=timed, args=(attacker,))
    held.start()
    time.sleep(1.5)  # the attacker's poll is waiting now
    newcomer = SwarmNode(Identity.load_or_create(Path(ws.node.identity.path).parent / "fresh.key"),
                         NetworkConfig(initial_peers=ws.node.maddrs()), "doors")
    try:
        assert timed(newcomer) < 2.0  # the fresh half is full: answered at once
    finally:
        newcomer.shutdown()
    assert timed(proven) >= 4.5  # held for its wait: the proven half is free
    held.join(10)
    print(f"\nlong polls: {dict(ws.stats)}")
    assert ws.stats["long_polls"] == 2 and ws.stats["long_polls_refused_unknown"] == 1


def _stream(node: SwarmNode, server: str, indices: list[int]) -> int:
    """Bytes of real chunks one chunk request got."""
    got = []
    node.call_stream(server, CHUNKS, ChunkRequest("chain", 0, indices, 0.0).encode(), 30, lambda item: got.append(len(item)))
    return sum(got)


def test_one_key_asking_the_keyframe_again_and_again_is_served_it_a_bounded_number_of_times(weight_door):
    """Before: 8 streams of one key drew 5.39 GB in 30 s from the learner. Now each chunk of a
    version goes to one peer at most MAX_REPEATS times; another fresh key still gets it whole."""
    ws, (attacker, newcomer), blob = weight_door
    served, stop = [], time.monotonic() + 6.0
    every = list(range(len(split_blob(blob))))  # the whole keyframe

    def ask() -> None:
        while time.monotonic() < stop:
            served.append(_stream(attacker, ws.node.peer_id, every))
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    print(f"\nkeyframe repeats: {len(served)} requests, {sum(served) / 2**20:.0f} MiB served "
          f"(without the bound: {len(served) * len(blob) / 2**20:.0f} MiB), {ws.store.repeats_refused} chunks refused")
    assert sum(served) == MAX_REPEATS * len(blob)
    assert ws.store.repeats_refused > 0 and ws.node.doors.stats()[CHUNKS]["calls"] > 0  # refused and counted
    assert _stream(newcomer, ws.node.peer_id, every) == len(blob)  # its own count, the pool ample
    assert len(blob) * (MAX_REPEATS + 1) < DOORS[CHUNKS].unproven_byte_burst


BASELINE_S = 60.0
"""How long the swarm runs unattacked first: the staleness (and rate) the attack is compared with.
At 4 groups a step on this CPU the learner makes ~10 versions a second, so the mean staleness of a
window of a few seconds swings with every weight fetch."""
SYBIL_RECORDS = int(os.environ.get("HETERO_SYBIL_RECORDS", 100))
"""100 in CI; HETERO_SYBIL_RECORDS=2000 is the issue's scale (making the keys takes ~100 s, loading them
~160 s; HETERO_SYBIL_KEYS=DIR keeps them for the next run)."""


def test_fresh_keys_records_as_mates_and_holders_cost_the_honest_samplers_at_most_a_fifth(tmp_path):
    """Before: 500 (2,000) valid peer records of fresh keys at a black-hole address, with holder
    records for the coming versions, became every sampler's mates and holders: each version waited
    on dead sources, honest rate x0.47 (x0.20, then 0), staleness 4 -> 26 (64). Now a sampler reads
    only its learner's tally and the records of the samplers it credits (each at its owner's own key:
    a fresh key's record is never read). 100 records in CI (HETERO_SYBIL_RECORDS for more); with
    mates and holders taken from any record (before issue 39), the same test saw staleness 23 -> 149
    (worst 319)."""
    keydir = Path(os.environ.get("HETERO_SYBIL_KEYS", tmp_path / "sybils"))  # keys may be made once, kept
    make_keys(keydir, SYBIL_RECORDS, load=False)  # before the swarm: 0.1 s of CPU a key
    s = Swarm(tmp_path)
    attack = None
    try:
        start_bootstrap(s)
        s.start_learner(LEARNER_TOML, nofile=NOFILE)
        for name in ("a", "b"):
            s.join(name, "sampler", "--name", name)
        s.wait_version(3, timeout=300)
        honest = [peer_of(s, n) for n in ("a", "b")]
        clock = lambda: [r["time_s"] for r in s.metrics() if r["kind"] == "step"][-1]  # noqa: E731
        t0 = clock()
        time.sleep(BASELINE_S)  # the staleness a swarm of this age has without the attack, over as long
        ts = clock()
        attack = subprocess.Popen([sys.executable, "-m", "tests.helpers.fake_records", str(keydir),
                                   str(SYBIL_RECORDS), "demo",
                                   peer_of(s, "learner"), BUILTIN_MODEL, s.addr], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=(s.logs / "fake_records.log").open("w"), text=True,
                                  start_new_session=True)  # its DHT's forked process goes with it (_kill_group)
        line = attack.stdout.readline()  # its keys loaded
        listed, deadline = 0, time.monotonic() + 240
        while listed < 0.9 * SYBIL_RECORDS and time.monotonic() < deadline:  # until the records are in the DHT
            line = attack.stdout.readline()
            assert line.startswith("stored"), (s.logs / "fake_records.log").read_text()[-2000:]
            listed = len([p for p in s.status() if p.get("role") == "sampler"])
        t1 = clock()
        time.sleep(90)
        t2 = clock()
        metrics = s.metrics()
        before = sum(flood_rates(metrics, p, t0, ts, t1)[0] for p in honest)
        during = sum(flood_rates(metrics, p, t0, t1, t2)[1] for p in honest)
        def stale(a: float, b: float, pick=statistics.mean) -> float:  # of the steps' mean staleness
            return pick([r["staleness_mean"] or 0 for r in metrics if r["kind"] == "step" and a <= r["time_s"] <= b])
        print(f"\n{SYBIL_RECORDS} sybil records ({line.strip()}; {listed} samplers listed): honest rate "
              f"{before:.2f} -> {during:.2f} groups/s (x{during / before:.2f}), staleness mean "
              f"{stale(t0, ts):.1f} -> {stale(t1, t2):.1f}, worst {stale(t0, ts, max):.1f} -> {stale(t1, t2, max):.1f}")
        assert listed >= 0.9 * SYBIL_RECORDS  # the records are in the DHT, as valid as any
        assert during >= 0.8 * before
        # a few versions at most: the attack did x6 (23 -> 149, against a baseline of the ~12 s the
        # records took to store: its mean moved from 19 to 40 between runs of the same code, and one
        # honest run went 28 -> 57, so the baseline is now a minute of the swarm before the attack)
        assert stale(t1, t2) <= 1.5 * stale(t0, ts) + 5
    finally:
        _kill_group(attack)
        s.stop_all()
