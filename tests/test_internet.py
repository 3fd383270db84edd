"""Volunteers behind home routers join with no flag (examples/internet.py: real NAT in namespaces).

The coordinator's bootstrap and learner are public; two samplers sit behind NAT routers (one that
drops every connection opened from outside, the common home case, and one that only masquerades)
and one sampler is public. Each runs `hetero-node join --role sampler --initial-peers ...` as the
README has it (plus `--no-nat`: no UPnP gateway here): each finds out for itself whether peers can
dial it, the learner trains on all three samplers' rollouts, and the weights reach all three.
Skipped, with the reason, where namespaces or nftables are missing."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cli.procs import wait_for_file
from examples.internet import Home, Internet, skip_reason
from examples.wan import LISTEN_PORT
from swarm.identity import Identity
from test_wan import _last_step, _sampler_version, _wait

pytestmark = pytest.mark.integration

LEARNER_TOML = "[learner]\ncheckpoint_every = 50\neval_every = 0\nmax_staleness = 1000\ngroups_per_step = 8\n"
SAMPLER_TOML = "status_every_s = 2.0\nannounce_every_s = 5.0\n"


def _log(base: Path, name: str) -> str:
    path = base / "logs" / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def test_volunteers_behind_nat_join_with_no_flag_and_the_swarm_learns(tmp_path):
    import shutil

    from external import missing

    if shutil.which("nft") is None:  # CI installs it (.ci/run): there its absence fails the test
        missing("nftables (the home routers' NAT)", "sudo apt-get install -y nftables")
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    homes = [Home(drop_inbound=True), Home(drop_inbound=False, rate_mbit=20)]
    with Internet(public=3, homes=homes, rate_mbit=100, workdir=tmp_path / "net") as net:
        logs = tmp_path / "logs"
        learner_id = Identity.load_or_create(tmp_path / "learner" / "identity.key").peer_id
        boot = net.start(0, "bootstrap", ["bootstrap", *net.public_args(0), "--identity", str(tmp_path / "boot.key"),
                                          "--addr-file", str(tmp_path / "boot.addr"), "--trusted-learner", learner_id],
                         logs)
        addr = wait_for_file(tmp_path / "boot.addr", 90, boot).decode().split()[0]
        assert addr.startswith(f"/ip4/{net.public_ip(0)}/tcp/{LISTEN_PORT}/p2p/"), addr
        (tmp_path / "learner.toml").write_text(LEARNER_TOML)
        (tmp_path / "sampler.toml").write_text(SAMPLER_TOML)
        join = ["join", "--initial-peers", addr]
        learner = net.start(1, "learner", [*join, "--role", "learner", *net.public_args(1),
                                           "--workdir", str(tmp_path / "learner"), "--config", str(tmp_path / "learner.toml")],
                            logs)
        hosts = {"public": 2, "home-drop": net.home_host(0), "home-masq": net.home_host(1)}
        samplers = [net.start(host, name, [*join, "--role", "sampler", "--no-nat", "--workdir", str(tmp_path / name),
                                           "--config", str(tmp_path / "sampler.toml")], logs)
                    for name, host in hosts.items()]
        procs = [learner, *samplers, boot]
        ids = {name: Identity.load_or_create(tmp_path / name / "identity.key").peer_id for name in hosts}

        def decided() -> bool:
            return all("reachability: " in _log(tmp_path, name) for name in hosts)

        _wait(decided, 120, "every sampler settled its reachability", procs)
        assert "joining as a public peer" in _log(tmp_path, "public"), _log(tmp_path, "public")[-2000:]
        for name in ("home-drop", "home-masq"):
            text = _log(tmp_path, name)
            assert f"could not connect to {net.router_ip(hosts[name] - net.public)}" in text, text[-2000:]
            assert "joining as a DHT client" in text

        def learned() -> bool:  # versions trained on rollouts from every sampler
            step = _last_step(tmp_path / "learner")
            return step["version"] >= 5 and all(step["accepted_by_sampler"].get(i, 0) > 0 for i in ids.values())

        _wait(learned, 240, "the learner did not reach version 5 on every sampler's rollouts", procs)
        _wait(lambda: all(_sampler_version(s) > 0 for s in samplers), 120,
              "every sampler loaded a version > 0 fetched through the NAT", procs)
        # the NAT holds: nothing on the internet opens a connection to a home, and homes reach the public
        assert not net.can_connect(1, net.router_ip(0), LISTEN_PORT)
        assert net.can_connect(net.home_host(0), net.public_ip(1), LISTEN_PORT)
        # a learner at home is told at start, in one line, that samplers could not reach it
        (tmp_path / "home-learner").mkdir()
        home_learner = net.start(net.home_host(1), "home-learner", [*join, "--role", "learner", "--no-nat", "--workdir",
                                                                    str(tmp_path / "home-learner")], logs)
        assert home_learner.popen.wait(timeout=120) == 2
        text = _log(tmp_path, "home-learner")
        assert "error: a learner behind a NAT cannot be reached by samplers" in text and "Traceback" not in text, text
        made = list(net._made)
    time.sleep(0.5)
    import subprocess

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert not any(n in listed for n in made), listed
    assert not any(p.group_alive() for p in procs)
