"""Volunteers behind home routers join with no flag (examples/internet.py: real NAT in namespaces).

The coordinator's bootstrap and learner are public; two samplers sit behind NAT routers (one that
drops every connection opened from outside, the common home case, and one that only masquerades)
and one sampler is public. Each runs `hetero-node join --role sampler --initial-peers ...` as the
README has it (plus `--no-nat`: no UPnP gateway here): each finds out for itself whether peers can
dial it, the learner trains on all three samplers' rollouts, and the weights reach all three.
Skipped, with the reason, where namespaces or nftables are missing; in CI that fails instead."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import time
from pathlib import Path


from cli.procs import stop, wait_for_file
from examples.internet import Home, Internet, skip_reason
from examples.wan import LISTEN_PORT
from swarm.identity import Identity
from helpers.emulated import LEARNER_TOML, SAMPLER_TOML, last_step, sampler_version, wait
from helpers.external import cannot, missing
from helpers.swarmkit import check_books


def _log(base: Path, name: str) -> str:
    path = base / "logs" / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def _need_internet() -> None:
    if shutil.which("nft") is None:  # CI installs it (.ci/run): there its absence fails the test
        missing("nftables (the home routers' NAT)", "sudo apt-get install -y nftables")
    cannot(skip_reason())  # a skip here, a failure in CI


def _start_coordinator(net: Internet, tmp_path: Path, logs: Path):
    """The bootstrap on public host 0, naming the learner whose key is in tmp_path/learner; its address."""
    learner_id = Identity.load_or_create(tmp_path / "learner" / "identity.key").peer_id
    boot = net.start(0, "bootstrap", ["bootstrap", *net.public_args(0), "--identity", str(tmp_path / "boot.key"),
                                      "--addr-file", str(tmp_path / "boot.addr"), "--trusted-learner", learner_id],
                     logs)
    return boot, wait_for_file(tmp_path / "boot.addr", 90, boot).decode().split()[0]


def test_volunteers_behind_nat_join_with_no_flag_and_the_swarm_learns(tmp_path):
    _need_internet()
    homes = [Home(drop_inbound=True), Home(drop_inbound=False, rate_mbit=20)]
    with Internet(public=3, homes=homes, rate_mbit=100, workdir=tmp_path / "net") as net:
        logs = tmp_path / "logs"
        boot, addr = _start_coordinator(net, tmp_path, logs)
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

        wait(decided, 120, "every sampler settled its reachability", procs)
        assert "joining as a public peer" in _log(tmp_path, "public"), _log(tmp_path, "public")[-2000:]
        for name in ("home-drop", "home-masq"):
            text = _log(tmp_path, name)
            assert f"could not connect to {net.router_ip(hosts[name] - net.public)}" in text, text[-2000:]
            assert "joining as a DHT client" in text

        def learned() -> bool:  # versions trained on rollouts from every sampler
            step = last_step(tmp_path / "learner")
            return step["version"] >= 5 and all(step["accepted_by_sampler"].get(i, 0) > 0 for i in ids.values())

        wait(learned, 240, "the learner did not reach version 5 on every sampler's rollouts", procs)
        wait(lambda: all(sampler_version(s) > 0 for s in samplers), 120,
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
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert not any(n in listed for n in made), listed
    assert not any(p.group_alive() for p in procs)


CHURN_LEARNER_TOML = "[learner]\ncheckpoint = { every = 5 }\neval_every = 0\nmax_staleness = 1000\ngroups_per_step = 8\n"


def _gaps_within_lifetimes(steps: list[dict]) -> list[float]:
    """Seconds between consecutive steps of one learner process. A restarted learner resumes from a
    checkpoint at or before the version it was killed at, and its time_s starts again from 0."""
    return [b["time_s"] - a["time_s"] for a, b in zip(steps, steps[1:])
            if b["version"] > a["version"] and b["time_s"] >= a["time_s"]]


def test_churn_across_the_internet_loses_nothing_acknowledged(tmp_path):
    """8 samplers, 6 of them at home behind NAT, killed with -9 and restarted at random, and the
    learner killed with -9 once: the learner goes on, nothing acknowledged is lost or credited twice,
    no process outlives its node."""
    _need_internet()
    homes = [Home(drop_inbound=j % 2 == 0, rate_mbit=(10, 50, 100)[j % 3]) for j in range(6)]
    with Internet(public=4, homes=homes, rate_mbit=100, workdir=tmp_path / "net") as net:
        logs = tmp_path / "logs"
        boot, addr = _start_coordinator(net, tmp_path, logs)
        (tmp_path / "learner.toml").write_text(CHURN_LEARNER_TOML)
        (tmp_path / "sampler.toml").write_text(SAMPLER_TOML)
        join = ["join", "--initial-peers", addr]
        learner_args = [*join, "--role", "learner", *net.public_args(1), "--workdir", str(tmp_path / "learner"),
                        "--config", str(tmp_path / "learner.toml")]
        hosts = {f"s{i}": 2 + i for i in range(2)} | {f"s{2 + j}": net.home_host(j) for j in range(6)}

        def start_sampler(name: str):
            return net.start(hosts[name], name, [*join, "--role", "sampler", "--no-nat", "--workdir",
                                                 str(tmp_path / name), "--config", str(tmp_path / "sampler.toml")], logs)

        procs = {"learner": net.start(1, "learner", learner_args, logs)} | {n: start_sampler(n) for n in hosts}
        wait(lambda: last_step(tmp_path / "learner")["version"] >= 3, 300, "the learner reached version 3",
              [*procs.values(), boot])

        def killed(proc) -> None:  # kill -9, as a crash; its DHT process and p2pd end by themselves
            proc.kill9()
            deadline = time.monotonic() + 15
            while proc.group_alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not proc.group_alive(), f"{proc.name}'s DHT process or p2pd outlived it"

        rng, learner_down_s = random.Random(0), 0.0
        for round_ in range(6):
            victim = rng.choice(sorted(hosts))
            killed(procs[victim])
            if round_ == 3:  # and the learner, once, while that sampler is down
                killed(procs["learner"])
                t_kill, v_kill = time.monotonic(), last_step(tmp_path / "learner")["version"]
                time.sleep(3)
                procs["learner"] = net.start(1, "learner", learner_args, logs)
                running = [p for n, p in procs.items() if n != victim]
                wait(lambda: last_step(tmp_path / "learner")["version"] > v_kill, 180,
                      "the restarted learner trained a new version", [*running, boot])
                learner_down_s = time.monotonic() - t_kill
            time.sleep(rng.uniform(2, 8))
            procs[victim] = start_sampler(victim)
            time.sleep(rng.uniform(5, 10))
        v_end = last_step(tmp_path / "learner")["version"]
        wait(lambda: last_step(tmp_path / "learner")["version"] >= v_end + 3, 180,
              "the learner kept training after the churn", [*procs.values(), boot])
        stop([procs["learner"]], grace=30)  # a graceful stop writes the final checkpoint
        state = check_books(tmp_path / "learner")
        lines = (tmp_path / "learner" / "metrics.jsonl").read_text().splitlines()
        steps = [r for r in map(json.loads, lines) if r["kind"] == "step"]
        gaps = _gaps_within_lifetimes(steps)
        assert max(gaps) <= 30, f"the learner stalled {max(gaps):.0f} s between two versions (gaps {gaps})"
        credited = {peer for peer, n in state["books"]["accepted_by_sampler"].items() if n > 0}
        ids = {Identity.load_or_create(tmp_path / n / "identity.key").peer_id for n in hosts}
        assert len(credited & ids) >= 6, f"only {len(credited & ids)} of 8 samplers' rollouts were trained on"
        print(f"\nchurn: {len(steps)} steps, longest gap {max(gaps):.1f} s, learner down {learner_down_s:.1f} s "
              f"(kill -9 to its next version), {len(state['checks']['seen'])} groups accepted, {len(credited & ids)} samplers")
        made = list(net._made)
        all_procs = [*procs.values(), boot, *net.nodes]
    time.sleep(0.5)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    assert not any(n in listed for n in made), listed
    assert not any(p.group_alive() for p in all_procs)
