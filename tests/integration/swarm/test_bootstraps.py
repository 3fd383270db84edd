"""A coordinator with two bootstrap peers, one of which dies (kill -9): the swarm goes on, and a
new sampler given both addresses joins through the other. Real processes on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import time


from cli.procs import wait_for_file
from swarm.dht.network import NetworkConfig
from swarm.identity import Identity
from helpers.swarmkit import Swarm, peer_of

LEARNER_TOML = "[learner]\ncheckpoint = { every = 50 }\neval_every = 0\nmax_staleness = 1000\ngroups_per_step = 8\n"


def _accepted(s: Swarm, name: str) -> int:
    steps = [r for r in s.metrics() if r["kind"] == "step"]
    return steps[-1]["accepted_by_sampler"].get(peer_of(s, name), 0) if steps else 0


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(1.0)


def test_the_swarm_outlives_one_of_two_bootstraps(tmp_path):
    from swarm.p2p import SwarmNode

    s = Swarm(tmp_path)
    learner_id = Identity.load_or_create(tmp_path / "learner" / "identity.key").peer_id
    addrs = []
    try:
        for k in (1, 2):  # the second links with the first (bootstrap --initial-peers)
            boot = s.start(f"boot{k}", ["bootstrap", "--port", "0", "--host", "127.0.0.1", "--no-nat",
                                        "--identity", str(tmp_path / f"boot{k}.key"), "--addr-file",
                                        str(tmp_path / f"boot{k}.addr"), "--trusted-learner", learner_id,
                                        *(["--initial-peers", addrs[0]] if addrs else [])])
            addrs.append(wait_for_file(tmp_path / f"boot{k}.addr", 90, boot).decode().split()[0])
        both = [a for addr in addrs for a in ("--initial-peers", addr)]
        (tmp_path / "learner.toml").write_text(LEARNER_TOML)
        s.start("learner", ["join", "--role", "learner", *both, "--no-nat", "--workdir", str(tmp_path / "learner"),
                            "--config", str(tmp_path / "learner.toml")])
        s.start("sampler-a", ["join", "--role", "sampler", *both, "--no-nat", "--workdir", str(tmp_path / "sampler-a")])
        s.wait_version(3, timeout=240)
        # each coordinator's swarm record is found through the other bootstrap alone
        probe = SwarmNode(Identity.load_or_create(tmp_path / "probe.key"), NetworkConfig(initial_peers=[addrs[1]]),
                          "demo")
        try:
            ids = [a.rsplit("/p2p/", 1)[1] for a in addrs]
            _wait(lambda: all(set(probe.trusted_learners({i})) == {learner_id} for i in ids), 60,
                  "both swarm records through the second bootstrap")
        finally:
            probe.shutdown()

        os.killpg(s.nodes["boot1"].popen.pid, signal.SIGKILL)
        s.nodes["boot1"].popen.wait(10)
        before = _accepted(s, "sampler-a")
        _wait(lambda: _accepted(s, "sampler-a") >= before + 16, 120, "sampler-a's groups trained after boot1 died")
        # a newcomer given both addresses, the first dead, joins through the second
        s.start("sampler-b", ["join", "--role", "sampler", *both, "--no-nat", "--workdir", str(tmp_path / "sampler-b")])
        _wait(lambda: _accepted(s, "sampler-b") > 0, 180, "sampler-b (joined with boot1 dead) trained on")
    finally:
        s.stop_all()
