"""The two attacks on discovery issue 58 measured, on a loopback swarm of real processes, for
tests/integration/swarm/test_discovery_attacks.py and examples/bench_discovery.py:

  - an eclipse: withholding DHT nodes XOR-next to every key that decides who trains (tests/helpers/
    eclipse.py): the swarm record's, the learner's peer record and tally, and the peers index;
  - a storage flood: fresh keys storing records at their largest (tests/helpers/storage_flood.py),
    then honest joins.

And what both read of the swarm: a newcomer's time to its first accepted group, a sampler's rate,
a node's memory (its process group: the node, its DHT process and p2pd).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cli.procs import NodeProcess, group_members, wait_for_file
from helpers.swarmkit import Swarm, peer_of
from swarm.dht.schema import own_key, peers_key
from swarm.identity import Identity

SWARM = "demo"  # join's default
LEARNER_TOML = "[learner]\ncheckpoint = { every = 10 }\neval_every = 0\ngroups_per_step = 16\n"
"""max_staleness at its default (64): the archive of versions it keeps, and so its memory, levels off
by version ~70, before the attacks start. 16 groups a step: with 4, the built-in model's learner made
~10 versions a second, and a newcomer's groups were all 64 versions stale when they arrived (the
bench's honest newcomer waited 279 s for its first accepted one)."""
WARM = 80
"""The version the swarm is run to before an attack (the archive full)."""


def critical_keys(s: Swarm) -> list[str]:
    """The DHT keys that decide who trains: the coordinator's swarm record, the learner's peer
    record and tally, and the peers index."""
    learner = peer_of(s, "learner")
    boot = Identity.load_or_create(s.base / "boot.key").peer_id
    return [own_key(SWARM, "swarm", boot), own_key(SWARM, "peer", learner), own_key(SWARM, "tally", learner),
            peers_key(SWARM)]


def start_eclipse(s: Swarm, per_key: int, keys: list[str], timeout: float = 300, control: bool = False) -> NodeProcess:
    """`per_key` withholding DHT nodes next to each of `keys`, joined through the bootstrap (with
    `control`, as many honest ones at random ids)."""
    ready = s.base / "eclipse.ready"
    node = s.start("eclipse", [str(ready), s.addr, str(per_key), *keys, *(["--control"] if control else [])],
                   module="tests.helpers.eclipse")
    wait_for_file(ready, timeout, node)
    return node


def start_storage_flood(s: Swarm, keys: int, keydir: Path, timeout: float = 600) -> tuple[NodeProcess, str]:
    """`keys` fresh keys storing their largest records; returns once a round is stored, with its line."""
    node = s.start("flood", [str(keydir), str(keys), SWARM, s.addr], module="tests.helpers.storage_flood")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [x for x in node.log_path.read_text(errors="replace").splitlines() if x.startswith("stored ")]
        if lines:
            return node, lines[0]
        if node.popen.poll() is not None:
            raise RuntimeError(f"the storage flood ended: see {node.log_path}")
        time.sleep(1)
    raise TimeoutError(f"the storage flood stored no round in {timeout} s")


def rss_mb(node: NodeProcess, dht_only: bool = False) -> float:
    """Resident memory of a node's process group (the node, its DHT process, its p2pd), MB; with
    `dht_only`, of its DHT process and p2pd alone (what DHT peers can fill: a learner's own process
    grows with its archive of versions and caches, whatever the DHT does)."""
    total = 0
    for pid in group_members(node.pgid):
        if dht_only and pid == node.pgid:
            continue
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass  # gone since listed
    return total / 1024


def cpu_s(node: NodeProcess) -> float:
    """CPU seconds (user + system) the live processes of a node's group have used so far."""
    total = 0
    for pid in group_members(node.pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def first_accepted(s: Swarm, peer: str, timeout: float) -> float:
    """Seconds until the learner's metrics first show a group of `peer` accepted (polled)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if any(r.get("accepted_by_sampler", {}).get(peer) for r in s.metrics() if r["kind"] == "step"):
            return time.monotonic() - t0
        time.sleep(0.25)
    raise TimeoutError(f"no group of {peer} accepted in {timeout} s; logs in {s.logs}")


def join_newcomer(s: Swarm, name: str, timeout: float = 120) -> float:
    """A new sampler joins by the bootstrap's address; seconds from its start to its first
    accepted group (its start: the interpreter, torch, the model, the swarm)."""
    t0 = time.monotonic()
    s.join(name, "sampler", "--name", name)
    peer = peer_of(s, name)
    first_accepted(s, peer, timeout - (time.monotonic() - t0))
    return time.monotonic() - t0


def learner_clock(s: Swarm) -> float:
    """The learner's clock (its metrics' time_s) now: the last step's."""
    steps = [r["time_s"] for r in s.metrics() if r["kind"] == "step"]
    return steps[-1] if steps else 0.0


def rate(s: Swarm, peer: str | None, t0: float, t1: float) -> float:
    """`peer`'s groups trained on per second over the learner's clock [t0, t1]; every sampler's
    together if `peer` is None."""
    points = [(r["time_s"], sum(r["accepted_by_sampler"].values()) if peer is None else
               r["accepted_by_sampler"].get(peer, 0)) for r in s.metrics() if r["kind"] == "step" and t0 <= r["time_s"] <= t1]
    return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) if len(points) > 1 else 0.0
