"""The swarm on hivemind, for real: peers as processes on 127.0.0.1, signed records, faults.

One module-scoped swarm (bootstrap, learner, two samplers of the learner's model and one of a
different model) serves the tests; a test that kills a node starts it again before it ends, so the
tests pass in any order. Every process group is reaped by PGID at the end and checked. A
test-local hivemind peer plays the attacker.
"""

from __future__ import annotations

import time

import msgpack
import pytest

from cli.procs import stop
from swarm.dht.network import NetworkConfig
from swarm.wire.envelope import seal
from swarm.identity import Identity
from helpers.swarmkit import Swarm, check_books, owed_now, peer_of as _peer, start_bootstrap, undelivered
from swarm.wire.rollout import CompletionRecord, RolloutGroup
from swarm.wire.batch import ROLLOUTS

LEARNER_TOML = ("[learner]\ncheckpoint = { every = 5 }\neval_every = 0\nmax_staleness = 1000\ngroups_per_step = 8\n"
                "foreign = { accept_models = [\"builtin:tiny-arith-b\"] }\n")  # named: taken as foreign (F-TIS), not audited


# ---- the swarm -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def swarm(tmp_path_factory):
    s = Swarm(tmp_path_factory.mktemp("swarm"))
    try:
        start_bootstrap(s)
        s.start_learner(LEARNER_TOML)
        s.join("sampler-a", "sampler")
        s.join("sampler-b", "sampler")
        s.join("sampler-x", "sampler", "--model", "builtin:tiny-arith-b")
        yield s
    finally:
        s.stop_all()


def test_discovery_status_shows_every_peer(swarm):
    deadline = time.monotonic() + 90
    while True:
        peers = swarm.status()
        roles = sorted(p["role"] for p in peers)
        if roles == ["bootstrap", "learner", "sampler", "sampler", "sampler"] or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert roles == ["bootstrap", "learner", "sampler", "sampler", "sampler"]
    by_id = {p["peer_id"]: p for p in peers}
    assert all(0 <= p["last_seen_s"] < 60 and p["expires_in"] > 0 for p in peers)
    assert by_id[_peer(swarm, "sampler-x")]["model_id"] == "builtin:tiny-arith-b"
    assert by_id[_peer(swarm, "learner")]["role"] == "learner"


def test_rollouts_flow_versions_advance_and_foreign_rollouts_go_to_ftis(swarm):
    swarm.wait_version(12, timeout=240)
    # every sampler's groups trained on: waited for, not read at v12 (on a slower CPU one sampler's
    # groups alone took the learner to v12 before the other two had sent any)
    names, deadline = ("sampler-a", "sampler-b", "sampler-x"), time.monotonic() + 180
    while True:
        steps = [r for r in swarm.metrics() if r["kind"] == "step"]
        accepted = steps[-1]["accepted_by_sampler"]
        if all(accepted.get(_peer(swarm, n), 0) > 0 for n in names) or time.monotonic() > deadline:
            break
        time.sleep(2)
    for name in names:
        assert accepted.get(_peer(swarm, name), 0) > 0, (name, accepted, steps[-1].get("version"))
    assert any("foreign" in r.get("routes", {}) for r in steps)  # F-TIS on the other model's rollouts
    assert any("own" in r.get("routes", {}) for r in steps)  # the stale loss on our own model's
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # samplers of our model pick up new versions
        versions = {p["peer_id"]: p["version"] for p in swarm.status()}
        if versions.get(_peer(swarm, "sampler-a"), 0) > 0 and versions.get(_peer(swarm, "sampler-b"), 0) > 0:
            break
        time.sleep(2)
    assert versions[_peer(swarm, "sampler-a")] > 0 and versions[_peer(swarm, "sampler-b")] > 0
    assert versions[_peer(swarm, "sampler-x")] == 0  # the foreign sampler keeps its own weights


def _attack_payloads(attacker: Identity, victim_sampler: str) -> tuple[list, dict[str, str]]:
    def group(gid: str, sampler: str, n_tokens: int = 2) -> RolloutGroup:
        comps = [CompletionRecord("5", [9] * n_tokens, [-0.1] * n_tokens, "stop", 1.0)] * 2
        return RolloutGroup(id=gid, swarm="demo", task="arithmetic-d2m1-+*", prompt_id="arith:2+3", prompt="2+3=",
                            model_id="builtin:tiny-arith", tokenizer="x", version=0, sampler=sampler, created=0.0,
                            completions=comps, sampling={"temperature": 1.0})

    forged = seal(attacker, group("forged", victim_sampler).encode())  # signs as itself, claims the victim
    env = msgpack.unpackb(seal(attacker, group("tampered", attacker.peer_id).encode()))
    env["r"] = env["r"].replace(b"2+3=", b"2+4=")  # edited after signing
    huge = seal(attacker, group("huge", attacker.peer_id, n_tokens=40_000).encode())  # too many tokens
    schema = seal(attacker, msgpack.packb({"id": "schema", "swarm": "demo"}))  # signed, but not a RolloutGroup
    items = [["forged", forged], ["tampered", msgpack.packb(env)], ["garbage", b"\x00not msgpack"], ["huge", huge],
             ["schema", schema]]
    return items, {"forged": "forged_sender", "tampered": "signature", "garbage": "undecodable", "huge": "oversize",
                   "schema": "schema"}


def test_forged_and_malformed_records_are_rejected_and_counted(swarm, tmp_path):
    from swarm.p2p import SwarmNode

    swarm.wait_version(1, timeout=180)  # the learner serves its RPCs (alone, this test starts the swarm)
    attacker = Identity.load_or_create(tmp_path / "attacker.key")
    # a fresh peer that knows only the bootstrap: its first call must wait for a route to the learner
    node = SwarmNode(attacker, NetworkConfig(initial_peers=[swarm.addr]), "demo")
    try:
        items, expected = _attack_payloads(attacker, _peer(swarm, "sampler-a"))
        learner = _peer(swarm, "learner")
        rejected, ok = {}, []
        for _ in range(30):  # items answered busy (the unproven keys' shared rate, drawn on by the
            # swarm's other new keys too) are sent again, as a sampler would
            reply = msgpack.unpackb(node.call_gated(learner, ROLLOUTS, msgpack.packb(items), timeout=60), raw=False)
            rejected.update(reply["rejected"])
            ok += reply["ok"]
            items = [item for item in items if item[0] not in {*reply["ok"], *reply["rejected"]}]  # busy or unread
            if not items:
                break
            time.sleep(1.0)
        assert ok == [] and rejected == expected, (ok, rejected, reply)
        for _ in range(30):  # unread while the unproven keys' shared rate is spent: sent again, as above
            junk = msgpack.unpackb(node.call_gated(learner, ROLLOUTS, b"\xc1", timeout=60), raw=False)
            if not junk.get("why"):
                break
            time.sleep(1.0)
        assert junk == {"ok": [], "rejected": {}, "busy": [], "backlog": junk["backlog"], "error": "batch_undecodable"}
    finally:
        node.shutdown()
    before = swarm.version()
    swarm.wait_version(before + 3, timeout=120)  # and the learner keeps training
    drops = [r for r in swarm.metrics() if r["kind"] == "step"][-1]["drops"]
    for reason in ("forged_sender", "signature", "undecodable", "oversize", "schema"):
        assert drops.get(reason, 0) >= 1, (reason, drops)


def test_kill9_sampler_learner_keeps_training(swarm):
    victim = swarm.nodes["sampler-b"]
    victim.kill9()  # nothing of its code runs: its DHT process notices and stops itself and p2pd
    try:
        deadline = time.monotonic() + 15
        while victim.group_alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not victim.group_alive(), "the killed node's DHT process or p2pd lived on (swarm/lifetime.py)"
        v = swarm.version()
        swarm.wait_version(v + 4, timeout=120)
    finally:
        stop([victim])
        swarm.join("sampler-b", "sampler")  # back, for the module's other tests


def test_kill9_learner_restart_redelivers_outbox_nothing_lost_or_counted_twice(swarm):
    learner = swarm.nodes["learner"]
    swarm.wait_version(max(swarm.version() + 2, 7), timeout=120)  # at least one checkpoint exists (every 5)
    learner.kill9()
    try:
        _learner_killed_and_restarted(swarm, learner)
    finally:
        stop([swarm.nodes["learner"]], grace=30)
        swarm.join("learner", "learner", "--config", str(swarm.base / "learner.toml"))  # back, for the module's other tests


def _learner_killed_and_restarted(swarm, learner) -> None:
    """The learner just killed -9: restarted from its checkpoint, it continues the versions and takes
    what samplers kept in their outboxes meanwhile, once; stopped gracefully, its books check."""
    stop([learner])  # reap its DHT and p2pd
    killed_at = swarm.version()
    n_before = sum(r["kind"] == "step" for r in swarm.metrics())
    time.sleep(3)  # samplers notice, keep generating into their outboxes
    waiting = owed_now(swarm.base / "sampler-a" / "outbox.db")  # made while no learner was there
    assert waiting
    ckpts = sorted((swarm.base / "learner" / "checkpoints").glob("v*"))
    resumed_from = int(ckpts[-1].name[1:])
    swarm.join("learner", "learner", "--config", str(swarm.base / "learner.toml"))
    swarm.wait_version(killed_at + 5, timeout=180)
    after = [r["version"] for r in swarm.metrics() if r["kind"] == "step"][n_before:]
    assert resumed_from <= killed_at
    assert after[:5] == list(range(resumed_from + 1, resumed_from + 6))  # the version sequence continues
    assert not undelivered(swarm.base / "sampler-a" / "outbox.db", waiting)  # delivered to the restarted learner
    # graceful stop writes a final checkpoint; then check the books
    stop([swarm.nodes["learner"]], grace=30)
    check_books(swarm.base / "learner")
