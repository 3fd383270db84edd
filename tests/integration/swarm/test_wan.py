"""A small swarm learns across an emulated WAN (examples/wan.py): every peer a real `hetero-node`
process in a network namespace of its own, 50 Mbit/s links, 60 ms RTT added by the relay that every
connection crosses (the peers announce its address). Skipped, with the reason, where namespaces
cannot be made (not root, no iproute2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


from cli.procs import NodeProcess, wait_for_file
from helpers.external import cannot
from examples.wan import LISTEN_PORT, Wan, in_ns, received_by, sent_by, skip_reason
from helpers.emulated import LEARNER_TOML, SAMPLER_TOML, last_step, sampler_version, wait
from swarm.identity import Identity

SAMPLERS = ("sampler-a", "sampler-b")


def _start_swarm(wan: Wan, base: Path) -> tuple[NodeProcess, NodeProcess, list[NodeProcess]]:
    logs = base / "logs"
    learner_id = Identity.load_or_create(base / "learner" / "identity.key").peer_id  # the bootstrap names it
    boot = wan.start(0, "bootstrap", ["bootstrap", *wan.net_args(0), "--identity", str(base / "boot.key"),
                                      "--addr-file", str(base / "boot.addr"), "--trusted-learner", learner_id], logs)
    addr = wait_for_file(base / "boot.addr", 90, boot).decode().split()[0]
    assert addr.startswith(wan.maddr(0) + "/p2p/"), addr  # it announces the relay, not where it listens
    (base / "learner.toml").write_text(LEARNER_TOML)
    (base / "sampler.toml").write_text(SAMPLER_TOML)
    join = ["join", "--initial-peers", addr]
    learner = wan.start(1, "learner", [*join, "--role", "learner", *wan.net_args(1), "--workdir", str(base / "learner"),
                                       "--config", str(base / "learner.toml")], logs)
    samplers = [wan.start(2 + k, name, [*join, "--role", "sampler", *wan.net_args(2 + k), "--workdir", str(base / name),
                                        "--config", str(base / "sampler.toml")], logs)
                for k, name in enumerate(SAMPLERS)]
    return boot, learner, samplers


def _hosts_cannot_reach_each_other(wan: Wan) -> bool:
    """Host 2 dialling host 1's own address directly fails: the hub does not forward."""
    probe = (f"import socket\ntry:\n    socket.create_connection(('{wan.ip(1)}', {LISTEN_PORT}), timeout=3)\n"
             f"except OSError:\n    raise SystemExit(0)\nraise SystemExit(1)")
    return subprocess.run(in_ns(wan.ns(2), [sys.executable, "-c", probe]), timeout=30).returncode == 0


def test_swarm_learns_across_an_emulated_wan(tmp_path):
    cannot(skip_reason())  # a skip here, a failure in CI
    with Wan(2 + len(SAMPLERS), rate_mbit=50, rtt_ms=60, workdir=tmp_path / "wan") as wan:
        boot, learner, samplers = _start_swarm(wan, tmp_path)
        procs = [learner, *samplers, boot]
        ids = [Identity.load_or_create(tmp_path / name / "identity.key").peer_id for name in SAMPLERS]

        def learned() -> bool:  # versions trained on rollouts from both samplers
            step = last_step(tmp_path / "learner")
            return step["version"] >= 5 and all(step["accepted_by_sampler"].get(i, 0) > 0 for i in ids)

        wait(learned, 150, "the learner did not reach version 5 on both samplers' rollouts", procs)
        wait(lambda: all(sampler_version(s) > 0 for s in samplers), 60,
              "the samplers did not load a version > 0 fetched across the WAN", procs)
        stats = wan.relay_stats()
        assert _hosts_cannot_reach_each_other(wan)
        ns = [wan.hub, *(wan.ns(i) for i in range(wan.n))]
    for host in (2, 3):  # weights reached each sampler and its rollouts reached the learner, all via the relay
        assert received_by(stats, host) > 100_000, stats
        assert stats["bytes"].get(f"{host}->1", 0) > 0, stats
    assert sent_by(stats, 1) > 100_000, stats
    assert stats["conns"], stats
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert not any(n in listed for n in ns), listed  # the namespaces are gone
    assert not any(p.group_alive() for p in procs)  # and so is every process started in them
