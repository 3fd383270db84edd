"""Where a peer listens and whom it dials first: `NetworkConfig`, and the checks of the addresses a
user names (bootstrap multiaddrs, announce addresses, the listen host), each failing with the fix.

Networking defaults are safe: loopback only and no UPnP/NAT-PMP gateway probing unless the
caller opts in, which a real `join` on the internet does.
"""

from __future__ import annotations

from dataclasses import dataclass, field




class SwarmConnectError(ConnectionError):
    """This peer could not join the swarm: `str(e)` says why, `fix` what to do about it."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.fix = fix


class BadAddressError(ValueError):
    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.fix = ("pass the address a bootstrap peer prints at start-up, like "
                    "/ip4/1.2.3.4/tcp/31337/p2p/QmXyz... (hetero-node bootstrap shows it)")


def is_loopback(maddr: str) -> bool:
    """Whether a multiaddr is on this machine (127.0.0.0/8, ::1)."""
    import ipaddress

    parts = maddr.split("/")
    try:
        return len(parts) > 2 and parts[1] in ("ip4", "ip6") and ipaddress.ip_address(parts[2]).is_loopback
    except ValueError:
        return False


def check_multiaddr(addr: str) -> str:
    """`addr` if it is a multiaddr that names a peer (/ip4/1.2.3.4/tcp/31337/p2p/Qm...)."""
    from hivemind.utils.multiaddr import Multiaddr

    try:
        protocols = {p.name for p in Multiaddr(addr).protocols()}
    except Exception:
        raise BadAddressError(f"initial peer {addr!r} is not a multiaddr") from None
    if "p2p" not in protocols:
        raise BadAddressError(f"initial peer {addr!r} has no /p2p/<peer id> part")
    return addr


def check_listen_host(host: str) -> str:
    """`host` if it is an IP address to listen on: p2pd takes /ip4/ or /ip6/ literals, never a name
    (`localhost` would end in the daemon's start-up failure, a traceback)."""
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        e = BadAddressError(f"listen host {host!r} is not an IP address (IPv4 or IPv6)")
        e.fix = ("pass --host 127.0.0.1 for this machine only (what localhost means), or 0.0.0.0 for all "
                 "interfaces")
        raise e from None
    return host


def listen_maddr(host: str, port: int) -> str:
    """The multiaddr p2pd listens on for an IP address `host` (checked by `check_listen_host`)."""
    return f"/ip{6 if ':' in host else 4}/{host}/tcp/{port}"


def check_announce_maddr(addr: str) -> str:
    """`addr` if it is a multiaddr with a TCP port other than 0 (what hivemind can announce)."""
    from hivemind.utils.multiaddr import Multiaddr

    try:
        port = int(Multiaddr(addr).value_for_protocol("tcp"))
    except Exception:
        port = 0
    if port == 0:
        e = BadAddressError(f"announce address {addr!r} is not a multiaddr with an explicit /tcp/<port>")
        e.fix = "announce where peers reach this one, e.g. --announce-maddr /ip4/1.2.3.4/tcp/31337"
        raise e
    return addr


@dataclass
class NetworkConfig:
    host: str = ""
    """Listen address, an IP address: 127.0.0.1 (this machine only) or 0.0.0.0 (all interfaces), or an
    IPv6 one (::1, ::); empty: 0.0.0.0 when a bootstrap is on another machine (on 127.0.0.1 nobody
    there could dial us), else 127.0.0.1."""
    port: int = 0
    """0 picks a free port (tests); a fixed port on a public machine."""
    public_ip: str | None = None
    """Announce this address to others (machines behind a public IP or port forward)."""
    nat_port_map: bool = False
    """UPnP/NAT-PMP gateway probing: off on loopback and in tests, on for a real `join`."""
    use_relay: bool = False
    use_auto_relay: bool = False
    client_mode: bool = False
    """Behind NAT with no open port: make outgoing connections only (reached through relays)."""
    reachability: str = "auto"
    """Whether peers can dial this one: auto (a joining node asks a bootstrap, swarm/p2p/reach.py, unless
    every bootstrap is on this machine), public, or private (= client_mode: a DHT client, reached
    through relays)."""
    initial_peers: list[str] = field(default_factory=list)
    """Multiaddrs of bootstrap peers, each with its /p2p/<peer id>."""
    announce_maddrs: list[str] = field(default_factory=list)
    """Announce exactly these multiaddrs (with an explicit port, e.g. /ip4/1.2.3.4/tcp/4001) instead of the
    listen address: a port forward or proxy in front of this peer (examples/wan.py's delaying relay)."""

    def __post_init__(self) -> None:
        for addr in self.initial_peers:
            check_multiaddr(addr)
        for addr in self.announce_maddrs:
            check_announce_maddr(addr)
        if self.host:
            check_listen_host(self.host)
        else:
            remote = any(not is_loopback(m) for m in self.initial_peers)
            self.host = "0.0.0.0" if remote or self.public_ip else "127.0.0.1"
        if self.reachability not in ("auto", "public", "private"):
            raise ValueError(f"reachability must be auto, public or private, not {self.reachability!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, not {self.port}")


def peer_id_of_maddr(addr: str) -> str:
    """The /p2p/<peer id> of a bootstrap multiaddr (checked by `check_multiaddr`)."""
    return addr.rstrip("/").rsplit("/p2p/", 1)[1].split("/")[0]
