"""A stranger's peer against a real swarm: it cannot hijack, flood or crash it.

A loopback swarm of real processes (bootstrap naming the learner, learner, one honest sampler)
and an attacker: a hivemind peer in this test process with its own fresh key, using only the
public protocol (DHT records and the rollout RPC). Each attack is refused or neutralised, and
counted; the honest sampler keeps its throughput and its outbox; the learner survives, also a
restart with everything the attack left in its journal.
"""

from __future__ import annotations

import threading
import time

import msgpack
import pytest

from cli.procs import stop
from node.models import BUILTIN_MODEL
from swarm.dht import NetworkConfig, peers_key
from swarm.envelope import open_envelope, seal
from swarm.identity import Identity
from swarm.records import CompletionRecord
from swarm.rollout_rpc import ROLLOUTS
from swarm.weight_rpc import MANIFEST
from swarmkit import Forger, Swarm, flood_rates, peer_of, start_bootstrap

# a version every 2 steps: versions in between were never published, and a claim of one is refused
LEARNER_TOML = ("[learner]\ncheckpoint_every = 10\neval_every = 0\nmax_staleness = 100000\n"
                "[learner.weights]\nevery_steps = 2\n")


@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    s = Swarm(tmp_path_factory.mktemp("adversary"))
    try:
        start_bootstrap(s)
        s.start_learner(LEARNER_TOML)
        s.join("honest", "sampler", "--name", "honest")
        s.wait_version(3, timeout=240)
        yield s
    finally:
        s.stop_all()


@pytest.fixture(scope="module")
def attacker(swarm, tmp_path_factory):
    from swarm.p2p import SwarmNode

    ident = Identity.load_or_create(tmp_path_factory.mktemp("attacker") / "attacker.key")
    node = SwarmNode(ident, NetworkConfig(initial_peers=[swarm.addr]), "demo")
    yield node
    node.shutdown()


def _send(node, learner: str, items: list) -> dict:
    return msgpack.unpackb(node.call(learner, ROLLOUTS, msgpack.packb(items), timeout=60), raw=False)


@pytest.mark.integration
def test_a_peer_announcing_itself_learner_is_not_followed(swarm, attacker):
    got = []

    async def impostor(payload: bytes, remote: str) -> bytes:  # would ack everything and drop it
        got.append(remote)
        return msgpack.packb({"ok": [], "rejected": {}, "busy": [], "backlog": 0})

    attacker.add_handler(ROLLOUTS, impostor)
    assert attacker.announce({"role": "learner", "model_id": BUILTIN_MODEL, "version": 10**6, "engine": "hf",
                              "throughput": 0.0, "maddrs": attacker.maddrs()}, ttl=120)
    before = swarm.version()
    time.sleep(25)  # samplers re-check their learner every 10 s
    swarm.wait_version(before + 3, timeout=120)  # the real learner still gets the honest rollouts
    honest = {p["peer_id"]: p for p in swarm.status()}[peer_of(swarm, "honest")]
    assert honest["learner"] == peer_of(swarm, "learner") and got == []
    assert "ignoring learner" in (swarm.logs / "honest.log").read_text()


@pytest.mark.integration
def test_oversized_forged_and_unknown_version_records_are_refused_before_the_ack(swarm, attacker):
    forger, learner = Forger(attacker.identity), peer_of(swarm, "learner")
    long_ids = [7] * 8192  # 2 x 8,192 tokens once crashed the learner (memory) and again on every restart
    long = forger.group(completions=[CompletionRecord("1" * 8192, long_ids, [-0.1] * 8192, "length", 0.0)] * 8)
    huge_id = forger.group(id="x" * (1 << 20))
    future = forger.group(version=10**9, chain="made-up")
    small = forger.group(completions=forger.group().completions[:2])
    # the learner's chain, from its signed manifest: v1 lies between published v0 and v2
    manifest = msgpack.unpackb(open_envelope(attacker.call(learner, MANIFEST, b"", timeout=30))[0], raw=False)
    assert 1 not in [e["version"] for e in manifest["versions"]]
    unpublished = forger.group(version=1, chain=manifest["chain"])
    reply = _send(attacker, learner, [forger.item(long), [huge_id.id[:64], seal(attacker.identity, huge_id.encode())],
                                      forger.item(future), forger.item(small), forger.item(unpublished)])
    assert reply["ok"] == [] and sorted(reply["rejected"].values()) == sorted(
        ["too_long", "oversize", "unknown_chain", "wrong_group_size", "unpublished_version"])
    before = swarm.version()
    swarm.wait_version(before + 2, timeout=120)  # alive and training
    drops = swarm.metrics()[-1]["drops"] if swarm.metrics()[-1]["kind"] == "step" else {}
    for reason in ("too_long", "unknown_chain", "wrong_group_size", "oversize", "unpublished_version"):
        assert drops.get(reason, 0) >= 1, (reason, drops)


@pytest.mark.integration
def test_peer_records_speak_only_for_their_signer_one_per_key(swarm, attacker):
    from hivemind.utils import get_dht_time

    from swarm.dht import _owner_subkey

    honest = peer_of(swarm, "honest")
    info = {"peer_id": honest, "role": "sampler", "model_id": BUILTIN_MODEL, "version": 0, "engine": "hf",
            "throughput": 0.0, "software": "x", "protocol": 1, "maddrs": [], "learner": "", "name": "pwned",
            "updated": float(get_dht_time())}
    own = _owner_subkey(attacker.identity)
    assert not attacker.dht.store(peers_key("demo"), info, get_dht_time() + 60, subkey=own)  # names the honest peer
    mine = {**info, "peer_id": attacker.peer_id, "name": "sybil"}
    stored = [attacker.dht.store(peers_key("demo"), mine, get_dht_time() + 60, subkey=b"%d" % i + own) for i in range(40)]
    assert not any(stored)  # 40 more subkeys of one key: none
    # its one own record (a later expiry than the one it announced as a learner: the DHT keeps the newest)
    assert attacker.dht.store(peers_key("demo"), mine, get_dht_time() + 300, subkey=own)
    peers = swarm.status()
    assert [p["name"] for p in peers if p["peer_id"] == honest] == ["honest"]
    assert sum(p["peer_id"] == attacker.peer_id for p in peers) == 1


@pytest.mark.integration
def test_a_flood_slows_only_the_flooder_and_memory_and_disk_stay_bounded(swarm, attacker, capsys):
    forger, learner, honest = Forger(attacker.identity), peer_of(swarm, "learner"), peer_of(swarm, "honest")
    pool = [forger.item(forger.group(i)) for i in range(512)]  # signed once: the flood costs the attacker little
    t_base = swarm.metrics()[-1]["time_s"]
    time.sleep(30)
    t_flood = swarm.metrics()[-1]["time_s"]
    counts, stop_flood = {"ok": 0, "rejected": 0, "calls": 0, "sent": 0}, threading.Event()

    def flood() -> None:
        i = 0
        while not stop_flood.is_set():
            batch = pool[i % 512: i % 512 + 256]
            reply = _send(attacker, learner, batch)
            i += 256
            counts["calls"], counts["sent"] = counts["calls"] + 1, counts["sent"] + len(batch)
            for k in ("ok", "rejected"):
                counts[k] += len(reply[k])

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    time.sleep(30)
    stop_flood.set()
    thread.join(60)
    counts["busy"] = counts["sent"] - counts["ok"] - counts["rejected"]  # answered busy, mostly unread
    t_end = swarm.metrics()[-1]["time_s"]
    base, during = flood_rates(swarm.metrics(), honest, t_base, t_flood, t_end)
    rss_mb = int(open(f"/proc/{swarm.nodes['learner'].popen.pid}/status").read().split("VmRSS:")[1].split()[0]) / 1024
    journal_mb = (swarm.base / "learner" / "journal.bin").stat().st_size / 2**20
    with capsys.disabled():
        print(f"\n  flood: {counts['calls']} calls, {counts['sent']} records sent "
              f"({counts['ok']} accepted, {counts['busy']} busy, {counts['rejected']} refused) in 30 s; honest sampler "
              f"{base:.2f} -> {during:.2f} groups/s trained on ({during / base:.0%}); learner RSS {rss_mb:.0f} MB, "
              f"journal {journal_mb:.2f} MB")
    assert counts["busy"] > 10 * counts["ok"]  # past its quota the flooder is answered busy
    assert during >= 0.5 * base  # the honest sampler keeps most of its rate (CPU is shared on one machine)
    assert rss_mb < 2048 and journal_mb < 16
    time.sleep(5)
    from swarm.outbox import Outbox

    assert len(Outbox(swarm.base / "honest" / "outbox.db")) < 256  # its outbox drains: nothing stuck


@pytest.mark.integration
def test_the_learner_survives_a_restart_after_the_attacks(swarm):
    learner = swarm.nodes["learner"]
    learner.kill9()
    stop([learner])
    v = swarm.version()
    swarm.join("learner", "learner", "--config", str(swarm.base / "learner.toml"))
    swarm.wait_version(v + 3, timeout=240)  # replays its journal, attack leftovers included, and goes on
    assert not (swarm.base / "learner" / "quarantine.bin").exists() or \
        (swarm.base / "learner" / "quarantine.bin").stat().st_size < 1 << 20
