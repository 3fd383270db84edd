"""An emulated internet on one Linux machine: public hosts, and volunteers behind home routers (NAT).

    with Internet(public=2, homes=[Home(), Home(drop_inbound=False, rate_mbit=10)]) as net:
        net.start(net.public_host(0), "bootstrap", ["bootstrap", *net.public_args(0), ...], log_dir)
        net.start(net.home_host(0), "sampler", ["join", "--role", "sampler", "--no-nat", ...], log_dir)

Topology (real routing, unlike examples/wan.py's relay): the hub namespace holds a bridge, "the
internet", with the public segment 11.99.0.0/24 (public-looking on purpose: libp2p treats private
ranges as local, and a relay test with 10/8 addresses got no circuit in one run; docs/DESIGN.md,
"Dependencies"). Public host i (namespace h<i>) is 11.99.0.<10+i> on it. Home j has a router
(namespace r<j>: 11.99.0.<100+j> on the bridge, 192.168.<j+1>.1 at home) that forwards and
masquerades (nftables) what leaves for the internet; with `drop_inbound` (the common home case) it
also drops every connection the internet opens towards home (no port forward, no UPnP). The
volunteer's host (namespace h<public+j>) is 192.168.<j+1>.2 with the router as its default route.
A home host reaches every public address and nothing reaches it unless it called first.

Rates are real kernel shaping (`tbf`): each public host's and each router's upload on its own end of
its link to the bridge, its download on the bridge's end, at the `Home`'s or the default rate.
There is no added delay here (no `netem`; examples/wan.py's delaying relay would hide the NAT, as
every connection would end at the relay). Namespaces are made per run and removed on exit, on
SIGTERM and at interpreter exit, as examples/wan.py's (its `remove_stale` knows these names too).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.wan import LISTEN_PORT, Wan, _run, in_ns, log, skip_reason as wan_skip_reason  # noqa: E402

PUBLIC_NET = "11.99.0"


@dataclass(frozen=True)
class Home:
    """A volunteer behind a home router."""

    drop_inbound: bool = True
    """The router drops connections opened from the internet (else it only masquerades: an opened
    connection then reaches the router itself, where no port is forwarded, and is refused)."""
    rate_mbit: float | None = None
    """Its access link, each way (None: the Internet's default)."""


@functools.cache
def skip_reason() -> str | None:
    """Why the emulated internet cannot be made here, or None."""
    reason = wan_skip_reason()
    if reason:
        return reason
    if shutil.which("nft") is None:
        return "no `nft` command for the home routers' NAT (apt-get install nftables)"
    return None


class Internet(Wan):
    """`public` hosts on the bridge and a volunteer behind a router for each of `homes`."""

    def __init__(self, public: int, homes: list[Home], rate_mbit: float = 100.0, workdir: Path | None = None,
                 queue_ms: float = 20.0) -> None:
        if public < 1 or public + len(homes) > 90:
            raise ValueError("need 1 <= public and public + homes <= 90")
        super().__init__(public + len(homes), rate_mbit=rate_mbit, rtt_ms=0.0, workdir=workdir, queue_ms=queue_ms)
        self.public, self.homes = public, list(homes)

    # addresses ---------------------------------------------------------------------------------
    def public_host(self, i: int) -> int:
        return i

    def home_host(self, j: int) -> int:
        return self.public + j

    def router(self, j: int) -> str:
        return f"{self.tag}-r{j}"

    @staticmethod
    def public_ip(i: int) -> str:
        return f"{PUBLIC_NET}.{10 + i}"

    @staticmethod
    def router_ip(j: int) -> str:
        """Home j's address on the internet: what peers see its volunteer at."""
        return f"{PUBLIC_NET}.{100 + j}"

    def ip(self, i: int) -> str:  # type: ignore[override]  (an instance's hosts, public or at home)
        return self.public_ip(i) if i < self.public else f"192.168.{i - self.public + 1}.2"

    def maddr(self, i: int) -> str:  # type: ignore[override]
        """Where the others dial public host i (home hosts cannot be dialled)."""
        return f"/ip4/{self.ip(i)}/tcp/{LISTEN_PORT}"

    def is_home(self, i: int) -> bool:
        return i >= self.public

    def relay_stats(self) -> dict:
        """Bytes each host has sent and received so far, from the kernel's shapers (libp2p's framing
        and encryption included), in examples/wan.py's form: {"bytes": {"i->*": sent, "*->i":
        received}}, so that `sent_by` and `received_by` read it unchanged."""
        out: dict[str, int] = {}
        for i in range(self.n):
            j = i - self.public
            up = (self.router(j), "wan0") if self.is_home(i) else (self.ns(i), "eth0")
            down = (self.hub, f"r{j}" if self.is_home(i) else f"h{i}")
            out[f"{i}->*"], out[f"*->{i}"] = _sent_bytes(*up), _sent_bytes(*down)
        return {"bytes": out, "conns": {}, "time": time.time()}

    def public_args(self, i: int) -> list[str]:
        """`hetero-node bootstrap/join` flags for public host i: its public address, a fixed port."""
        return ["--host", "0.0.0.0", "--public-ip", self.public_ip(i), "--port", str(LISTEN_PORT), "--no-nat"]

    # building ------------------------------------------------------------------------------------
    def __enter__(self) -> "Internet":
        reason = skip_reason()
        if reason:
            raise RuntimeError(reason)
        return super().__enter__()  # type: ignore[return-value]

    def _start_relay(self) -> None:  # no delaying relay: connections are routed
        pass

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._add_ns(self.hub)
        self._ip("link", "add", "br0", "type", "bridge", ns=self.hub)
        self._ip("link", "set", "br0", "up", ns=self.hub)
        for i in range(self.public):
            self._attach(self.ns(i), f"h{i}", "eth0", self.public_ip(i), self.rate_mbit)
        for j, home in enumerate(self.homes):
            router, host = self.router(j), self.ns(self.home_host(j))
            self._attach(router, f"r{j}", "wan0", self.router_ip(j), home.rate_mbit or self.rate_mbit)
            self._add_ns(host)
            _run("ip", "link", "add", "lan0", "netns", router, "type", "veth", "peer", "name", "eth0", "netns", host)
            self._ip("addr", "add", f"192.168.{j + 1}.1/24", "dev", "lan0", ns=router)
            self._ip("link", "set", "lan0", "up", ns=router)
            self._ip("addr", "add", f"{self.ip(self.home_host(j))}/24", "dev", "eth0", ns=host)
            self._ip("link", "set", "eth0", "up", ns=host)
            self._ip("route", "add", "default", "via", f"192.168.{j + 1}.1", ns=host)
            _run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            _nft(router, _router_rules(home.drop_inbound))
        log.info("emulated internet %s: %d public hosts, %d homes (%d dropping inbound), %.0f Mbit/s by default",
                 self.tag, self.public, len(self.homes), sum(h.drop_inbound for h in self.homes), self.rate_mbit)

    def _attach(self, ns: str, hub_if: str, dev: str, ip: str, rate_mbit: float) -> None:
        """Namespace `ns` on the bridge as `ip`, its link shaped at `rate_mbit` each way."""
        self._add_ns(ns)
        _run("ip", "link", "add", hub_if, "netns", self.hub, "type", "veth", "peer", "name", dev, "netns", ns)
        self._ip("link", "set", hub_if, "master", "br0", ns=self.hub)
        self._ip("link", "set", hub_if, "up", ns=self.hub)
        self._ip("addr", "add", f"{ip}/24", "dev", dev, ns=ns)
        self._ip("link", "set", dev, "up", ns=ns)
        self._shape(ns, dev, rate_mbit)  # its upload
        self._shape(self.hub, hub_if, rate_mbit)  # its download

    def can_connect(self, host: int, ip: str, port: int) -> bool:
        """Whether a TCP connection from `host` to ip:port opens (3 s)."""
        probe = (f"import socket\ntry:\n    socket.create_connection(('{ip}', {port}), timeout=3)\n"
                 f"except OSError:\n    raise SystemExit(1)")
        return subprocess.run(in_ns(self.ns(host), [sys.executable, "-c", probe]), timeout=30).returncode == 0


def _router_rules(drop_inbound: bool) -> str:
    rules = 'table ip nat {\n  chain postrouting {\n    type nat hook postrouting priority 100;\n' \
            '    oifname "wan0" masquerade\n  }\n}\n'
    if drop_inbound:
        rules += 'table ip filter {\n  chain forward {\n    type filter hook forward priority 0; policy accept;\n' \
                 '    ct state established,related accept\n    iifname "wan0" ct state new drop\n  }\n' \
                 '  chain input {\n    type filter hook input priority 0; policy accept;\n' \
                 '    ct state established,related accept\n    iifname "wan0" ct state new drop\n  }\n}\n'
    return rules


def _sent_bytes(ns: str, dev: str) -> int:
    """Bytes the qdisc of `dev` in `ns` has sent (`tc -s`)."""
    out = _run("tc", "-s", "-n", ns, "qdisc", "show", "dev", dev).stdout
    m = re.search(r"Sent (\d+) bytes", out)
    return int(m.group(1)) if m else 0


def _nft(ns: str, rules: str) -> None:
    subprocess.run(in_ns(ns, ["nft", "-f", "-"]), input=rules, text=True, capture_output=True, timeout=10, check=True)
