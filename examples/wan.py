"""An emulated WAN on one Linux machine: hosts in network namespaces, shaped links, a delaying relay.

    with Wan(n_hosts=4, rate_mbit=100, rtt_ms=80) as wan:
        wan.start(0, "bootstrap", ["bootstrap", *wan.net_args(0), ...], log_dir)
        ...
        wan.relay_stats()   # bytes that crossed the WAN, per (source host, destination host)

Topology. Host i is the namespace `hn-<pid>-<tag>-h<i>` with one interface, `eth0`, address
10.77.<i+1>.2/24, joined by a veth link to a hub namespace (`hn-<pid>-<tag>-hub`, address
10.77.<i+1>.1 on its end). The hub does not forward IP (ip_forward stays 0), and a host has a route to
one hub address only, the relay's 10.77.0.1: hosts cannot reach each other except through the relay,
and nothing leaves the namespaces this module made (no route to the root namespace or the internet).

Bandwidth is real kernel shaping: a `tbf` qdisc on the host end of each veth (the host's upload) and
one on the hub end (its download), at `rate_mbit` each way. A byte from host a to host b crosses a's
uplink and b's downlink, as on the internet, where access links are the bottleneck.

Latency is not kernel-made: this machine's `tc` has no `netem`. A user-space TCP relay (`python
examples/wan.py relay`, its own process in the hub) listens on 10.77.0.1:<40000+i> for host i and
forwards to host i's real listen address. Each direction of each connection is a queue: a buffer read
at time t is written on at t + rtt/2 (never earlier than the buffer before it: bytes stay in order),
so every request/response exchange pays the RTT while the byte rate stays the shaped one (the queue
holds up to `window` bytes, 4 MiB by default, then stops reading: backpressure). Peers announce the
relay's address (`--announce-maddr`), so every connection crosses it.

What the relay stands for, precisely:
  * modelled: propagation delay of rtt/2 each way for every byte, so each RPC, DHT hop and stream
    opening costs one RTT, and libp2p's own flow control (yamux stream windows: their window
    updates travel back through the relay) sees the real RTT;
  * not modelled: the kernel's TCP sees no delay (each TCP connection ends at the relay, ~0 ms
    away), so TCP slow start, slow start after idle and cwnd/RTT coupling cost nothing here. Each
    would add round trips on a real WAN: at 100 Mbit/s and 80 ms a cold connection needs ~6 RTTs
    (~0.5 s) to open its window to the 1 MB bandwidth-delay product.
  * loss (`loss` = p per 1448-byte segment): no netem and no iptables, so no packet is really dropped.
    A buffer of n bytes is "hit" with probability 1 - (1 - p)^ceil(n / 1448), and a hit buffer is
    released one RTT late (what a fast retransmit costs), holding back every byte behind it (TCP
    delivers in order). The congestion-window halving a real loss also causes is not modelled.

Every namespace is made per run (the creating process's pid and a random tag in the name) and
removed on exit, on SIGTERM and at interpreter exit; `remove_stale()` (run on entry) removes those of
runs whose creating process is gone, killing, by pid, what still ran inside them.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import functools
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cli.procs import NodeProcess, stop  # noqa: E402

log = logging.getLogger(__name__)

PREFIX = "hn-"
RELAY_IP = "10.77.0.1"
RELAY_PORT0 = 40000
LISTEN_PORT = 31337
"""Every host listens on this port of its own address (namespaces do not share ports)."""
SEGMENT = 1448
"""TCP payload of one 1500-byte packet: the unit the loss probability is per."""
_NAME = re.compile(rf"^{PREFIX}(\d+)-[0-9a-f]+-(hub|h\d+|r\d+)$")
"""Namespaces this module and examples/internet.py make: a hub, hosts, home routers."""


# ---- running commands ------------------------------------------------------------------------------

def _run(*cmd: str, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=check)


def in_ns(ns: str, argv: list[str]) -> list[str]:
    """`argv` run inside namespace `ns`. `ip netns exec` execs in place (no fork): the pid we get is
    the command's own, so process-group cleanup (cli/procs.py) works unchanged."""
    return ["ip", "netns", "exec", ns, *argv]


def _ns_pids(ns: str) -> list[int]:
    out = _run("ip", "netns", "pids", ns, check=False)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def _delete_ns(ns: str) -> None:
    """Kill (by pid) whatever still runs in `ns`, then remove it; its veth ends go with it."""
    for pid in _ns_pids(ns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _run("ip", "netns", "delete", ns, check=False)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def remove_stale() -> list[str]:
    """Remove namespaces left by runs whose creating process is gone (names carry its pid). A pid
    since reused by another process keeps its namespaces: safe, if not thorough."""
    out = _run("ip", "netns", "list", check=False).stdout
    stale = [m.group(0) for line in out.splitlines() if (m := _NAME.match(line.split()[0] if line.split() else ""))
             and not _alive(int(m.group(1)))]
    for ns in stale:
        _delete_ns(ns)
    if stale:
        log.info("removed %d namespaces of dead runs: %s", len(stale), " ".join(stale))
    return stale


@functools.cache
def skip_reason() -> str | None:
    """Why namespaces with shaped veth links cannot be made here, or None if they can (made and
    removed once, to be sure)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "making network namespaces needs root (ip netns add)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command (apt-get install iproute2)"
    a, b = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}-hub", f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}-h0"
    try:
        for cmd in (["ip", "netns", "add", a], ["ip", "netns", "add", b],
                    ["ip", "link", "add", "v", "netns", a, "type", "veth", "peer", "name", "eth0", "netns", b],
                    ["tc", "-n", b, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "10mbit", "burst", "32kb",
                     "latency", "20ms"]):
            out = _run(*cmd, check=False)
            if out.returncode != 0:
                return f"cannot make an emulated WAN here: `{' '.join(cmd)}` failed: {out.stderr.strip()}"
    finally:
        _delete_ns(a)
        _delete_ns(b)
    return None


# ---- the WAN ---------------------------------------------------------------------------------------

class Wan:
    """`n_hosts` namespaces on shaped links through a hub with the delaying relay (module docstring)."""

    def __init__(self, n_hosts: int, rate_mbit: float = 100.0, rtt_ms: float = 80.0, loss: float = 0.0,
                 workdir: Path | None = None, window: int = 4 << 20, queue_ms: float = 20.0,
                 sockbuf: int = 0) -> None:
        if not 1 <= n_hosts <= 250:
            raise ValueError(f"n_hosts must be 1..250, not {n_hosts}")
        if rate_mbit <= 0 or rtt_ms < 0 or not 0 <= loss < 1:
            raise ValueError("need rate_mbit > 0, rtt_ms >= 0 and 0 <= loss < 1")
        self.n, self.rate_mbit, self.rtt_ms, self.loss = n_hosts, rate_mbit, rtt_ms, loss
        self.window, self.queue_ms, self.sockbuf = window, queue_ms, sockbuf
        """Relay queue per direction (bytes); tbf queue (ms at the link rate: a modest bufferbloat); the
        relay's kernel socket buffers, each way of each connection (bytes; 0: the kernel's autotuning)."""
        self.tag = f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.workdir = Path(workdir or f"/tmp/{self.tag}")
        self.nodes: list[NodeProcess] = []
        self.relay: NodeProcess | None = None
        self._made: list[str] = []
        self._closed = False
        self._old_sigterm = None

    # addresses ---------------------------------------------------------------------------------
    @property
    def hub(self) -> str:
        return f"{self.tag}-hub"

    def ns(self, i: int) -> str:
        return f"{self.tag}-h{i}"

    @staticmethod
    def ip(i: int) -> str:
        """Host i's own address, where it listens."""
        return f"10.77.{i + 1}.2"

    @staticmethod
    def maddr(i: int) -> str:
        """Where the others reach host i: its port on the relay (what it announces)."""
        return f"/ip4/{RELAY_IP}/tcp/{RELAY_PORT0 + i}"

    def net_args(self, i: int) -> list[str]:
        """`hetero-node bootstrap/join` flags that make host i listen at home and announce the relay."""
        return ["--host", self.ip(i), "--port", str(LISTEN_PORT), "--announce-maddr", self.maddr(i), "--no-nat"]

    def one_copy_s(self, nbytes: int) -> float:
        """The physical limit for one copy of `nbytes`: its time on one link, plus one RTT."""
        return nbytes * 8 / (self.rate_mbit * 1e6) + self.rtt_ms / 1e3

    # lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> "Wan":
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        remove_stale()
        if threading.current_thread() is threading.main_thread():
            # SIGTERM unwinds the `with` (SystemExit), so the namespaces are removed on the way out
            self._old_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        atexit.register(self.close)
        try:
            self._build()
            self._start_relay()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop every process started here (SIGTERM to its group, then SIGKILL), then the relay, then
        remove the namespaces. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            stop(self.nodes)
            if self.relay is not None:
                stop([self.relay], grace=5)
        finally:
            for ns in reversed(self._made):
                _delete_ns(ns)
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
            atexit.unregister(self.close)
            log.info("emulated WAN %s removed", self.tag)

    def _ip(self, *args: str, ns: str | None = None) -> None:
        _run(*(["ip", "-n", ns] if ns else ["ip"]), *args)

    def _add_ns(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self._made.append(ns)
        self._ip("link", "set", "lo", "up", ns=ns)

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._add_ns(self.hub)
        _run("ip", "netns", "exec", self.hub, "sysctl", "-qw", "net.ipv4.ip_forward=0")
        self._ip("addr", "add", f"{RELAY_IP}/32", "dev", "lo", ns=self.hub)
        for i in range(self.n):
            host, hub_if = self.ns(i), f"h{i}"
            self._add_ns(host)
            # both ends are born inside their namespaces: no name is ever taken in the root namespace
            _run("ip", "link", "add", hub_if, "netns", self.hub, "type", "veth", "peer", "name", "eth0", "netns", host)
            self._ip("addr", "add", f"10.77.{i + 1}.1/24", "dev", hub_if, ns=self.hub)
            self._ip("addr", "add", f"{self.ip(i)}/24", "dev", "eth0", ns=host)
            self._ip("link", "set", hub_if, "up", ns=self.hub)
            self._ip("link", "set", "eth0", "up", ns=host)
            self._ip("route", "add", f"{RELAY_IP}/32", "via", f"10.77.{i + 1}.1", ns=host)
            self._shape(host, "eth0")  # host i's upload
            self._shape(self.hub, hub_if)  # host i's download
        log.info("emulated WAN %s: %d hosts, %.0f Mbit/s each way, %.0f ms RTT, loss %.2g", self.tag, self.n,
                 self.rate_mbit, self.rtt_ms, self.loss)

    def _shape(self, ns: str, dev: str, rate_mbit: float | None = None) -> None:
        rate_mbit = rate_mbit or self.rate_mbit
        rate_bytes = rate_mbit * 1e6 / 8
        burst = max(32 * 1024, int(rate_bytes * 0.002))  # >= rate/HZ, so tbf can reach the rate
        _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
             "burst", str(burst), "latency", f"{self.queue_ms}ms")

    def _start_relay(self) -> None:
        spec = {"listen": RELAY_IP, "routes": [[RELAY_PORT0 + i, self.ip(i), LISTEN_PORT] for i in range(self.n)],
                "hosts": {self.ip(i): i for i in range(self.n)}, "delay_s": self.rtt_ms / 2e3,
                "rtt_s": self.rtt_ms / 1e3, "loss": self.loss, "window": self.window, "sockbuf": self.sockbuf,
                "stats": str(self.workdir / "relay.json")}
        (self.workdir / "relay-spec.json").write_text(json.dumps(spec))
        self.relay = self.spawn("relay", self.hub, [sys.executable, str(Path(__file__).resolve()), "relay",
                                                    str(self.workdir / "relay-spec.json")], self.workdir / "logs")
        deadline = time.monotonic() + 30
        while not (self.workdir / "relay.json").exists():
            if self.relay.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the relay did not start; see {self.relay.log_path}")
            time.sleep(0.05)

    # processes -----------------------------------------------------------------------------------
    def spawn(self, name: str, ns: str, argv: list[str], log_dir: Path, threads: int = 1) -> NodeProcess:
        """`argv` in namespace `ns`, in a session of its own (as cli/procs.start_node), logging to
        `log_dir/<name>.log`; stopped by `close`."""
        log_dir.mkdir(parents=True, exist_ok=True)
        log_path = log_dir / f"{name}.log"
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HETERO_NODE_THREADS": str(threads),
               "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(in_ns(ns, argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=env, cwd=ROOT, start_new_session=True)
        proc = NodeProcess(name, popen, log_path)
        if name != "relay":
            self.nodes.append(proc)
        return proc

    def start(self, i: int, name: str, args: list[str], log_dir: Path, module: str = "cli.main") -> NodeProcess:
        """`python -m <module> <args>` on host i (e.g. `hetero-node join`; add `net_args(i)`)."""
        return self.spawn(name, self.ns(i), [sys.executable, "-m", module, *args], log_dir)

    def relay_stats(self) -> dict:
        """{"bytes": {"a->b": n}, "conns": {"a->b": n}, "peak": {"a->b": n}, "time": t}: bytes the relay
        delivered from host a to host b (payload as libp2p sent it: encrypted, framed), and the most one
        connection from a to b held in the relay's queue since the last write; written twice a second."""
        try:
            return json.loads((self.workdir / "relay.json").read_text())
        except (OSError, ValueError):  # mid-rename: the next read gets it
            return {"bytes": {}, "conns": {}, "time": 0.0}


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def sent_by(stats: dict, host: int) -> int:
    """Bytes host `host` uploaded across the relay (to every other host)."""
    return sum(n for k, n in stats.get("bytes", {}).items() if k.split("->")[0] == str(host))


def received_by(stats: dict, host: int) -> int:
    return sum(n for k, n in stats.get("bytes", {}).items() if k.split("->")[1] == str(host))


# ---- the relay (its own process, in the hub namespace) ------------------------------------------------

class Relay:
    """Delaying TCP forwarder: one listening port per host (module docstring)."""

    def __init__(self, spec: dict) -> None:
        self.spec = spec
        self.delay, self.rtt, self.loss, self.window = spec["delay_s"], spec["rtt_s"], spec["loss"], spec["window"]
        self.sockbuf = spec.get("sockbuf", 0)
        self.hosts: dict[str, int] = spec["hosts"]
        self.bytes: collections.Counter[str] = collections.Counter()
        self.conns: collections.Counter[str] = collections.Counter()
        self.peak: collections.Counter[str] = collections.Counter()
        """Per (source host, destination host): the most bytes one connection's queue held at once since
        the stats were last written (every 0.5 s)."""
        self.rng = random.Random(0)

    async def serve(self, stopped: asyncio.Event) -> None:
        servers = [await asyncio.start_server(functools.partial(self._on_client, dst, (ip, port)), self.spec["listen"],
                                              listen_port, limit=1 << 20)
                   for listen_port, ip, port in self.spec["routes"] for dst in [self.hosts[ip]]]
        writer = asyncio.create_task(self._write_stats_forever(), name="relay-stats")
        await stopped.wait()
        writer.cancel()
        for s in servers:
            s.close()
        self._write_stats()

    async def _on_client(self, dst: int, target: tuple[str, int], creader: asyncio.StreamReader,
                         cwriter: asyncio.StreamWriter) -> None:
        peer = cwriter.get_extra_info("peername")
        src = self.hosts.get(peer[0] if peer else "", -1)
        try:  # the target is one hop away in the hub: it answers within a second or it is down
            treader, twriter = await asyncio.wait_for(asyncio.open_connection(*target, limit=1 << 20), timeout=5)
        except (OSError, asyncio.TimeoutError) as e:
            log.debug("relay: host %d unreachable at %s:%d: %s", dst, *target, e)
            cwriter.close()
            return
        self.conns[f"{src}->{dst}"] += 1
        if self.sockbuf:  # what the kernel may hold besides our queue: otherwise autotuned, up to tcp_rmem's max
            try:
                for w in (cwriter, twriter):
                    sock = w.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.sockbuf)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sockbuf)
            except OSError as e:  # a connection already gone
                log.debug("relay: socket buffers of %d->%d not set: %s", src, dst, e)
                cwriter.close()
                twriter.close()
                return

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
            try:
                await self._pump(reader, writer, key)
            except (OSError, asyncio.IncompleteReadError):  # a reset: end both directions (their reads see EOF)
                cwriter.close()
                twriter.close()

        # a proxy's reads wait for as long as the peers keep the connection open; each ends when
        # either side closes, or with the relay
        await asyncio.gather(pump(creader, twriter, f"{src}->{dst}"), pump(treader, cwriter, f"{dst}->{src}"))
        for w in (cwriter, twriter):
            w.close()

    def _late(self, n: int) -> bool:
        """Whether a buffer of `n` bytes lost a segment (then it is released one RTT late)."""
        return self.loss > 0 and self.rng.random() < 1 - (1 - self.loss) ** math.ceil(max(n, 1) / SEGMENT)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: str) -> None:
        """One direction: bytes read at t are written at t + rtt/2 (in order), at most `window` queued."""
        loop = asyncio.get_running_loop()
        queue: collections.deque[tuple[float, bytes]] = collections.deque()
        state = {"queued": 0, "last": 0.0}
        ready, room = asyncio.Event(), asyncio.Event()
        room.set()

        async def produce() -> None:
            while True:
                await room.wait()
                data = await reader.read(1 << 16)
                release = max(loop.time() + self.delay + (self.rtt if data and self._late(len(data)) else 0.0),
                              state["last"])
                state["last"] = release
                queue.append((release, data))
                state["queued"] += len(data)
                self.peak[key] = max(self.peak[key], state["queued"])
                ready.set()
                if state["queued"] >= self.window:
                    room.clear()
                if not data:
                    return

        async def consume() -> None:
            while True:
                while not queue:
                    ready.clear()
                    await ready.wait()
                wait = queue[0][0] - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                out = []
                while queue and queue[0][0] <= loop.time() + 0.0005:  # all that is due, in one write
                    out.append(queue.popleft()[1])
                data = b"".join(out)
                state["queued"] -= len(data)
                if state["queued"] < self.window:
                    room.set()
                if data:
                    writer.write(data)
                    await writer.drain()
                    self.bytes[key] += len(data)
                if out and not out[-1]:  # EOF: half-close, as the sender did
                    if writer.can_write_eof():
                        writer.write_eof()
                    return

        producer = asyncio.create_task(produce(), name=f"relay-read-{key}")
        try:
            await consume()
        finally:
            producer.cancel()

    def _write_stats(self) -> None:
        path = Path(self.spec["stats"])
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"bytes": dict(self.bytes), "conns": dict(self.conns), "peak": dict(self.peak),
                                   "time": time.time()}))
        tmp.replace(path)  # atomic: a reader never sees half a file
        self.peak.clear()

    async def _write_stats_forever(self) -> None:
        while True:
            self._write_stats()
            await asyncio.sleep(0.5)


def relay_main(spec_path: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s relay %(message)s")
    spec = json.loads(Path(spec_path).read_text())

    async def main() -> None:
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        await Relay(spec).serve(stopped)

    log.info("relaying %d hosts, %.0f ms each way, loss %.2g", len(spec["routes"]), spec["delay_s"] * 1e3, spec["loss"])
    asyncio.run(main())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="the delaying relay of an emulated WAN (started by Wan)")
    ap.add_argument("command", choices=["relay"])
    ap.add_argument("spec")
    args = ap.parse_args()
    relay_main(args.spec)
