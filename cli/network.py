"""The network flags of `bootstrap` and `join` as [network] overrides (swarm.dht.network.NetworkConfig checks
them with the rest of the config), and the defaults that depend on where this machine listens."""

from __future__ import annotations

import ipaddress
from typing import Optional

from cli.errors import UserError


def network_overrides(host: Optional[str], port: Optional[int], public_ip: Optional[str], initial_peers: list[str],
                      client_mode: Optional[bool], nat: Optional[bool], relay: bool, announce: list[str] = (),
                      reachability: Optional[str] = None) -> dict:
    """The [network] table's overrides from the flags given (validated with the rest of the config): a
    flag left out is None, which the loader drops, so the config file's value stands."""
    check_public_ip(public_ip)
    out = {"network.host": host, "network.port": port, "network.public_ip": public_ip,
           "network.reachability": reachability,
           "network.initial_peers": list(initial_peers) or None, "network.client_mode": client_mode,
           "network.announce_maddrs": list(announce) or None, "network.nat_port_map": nat}
    if relay or client_mode:  # a relay is what a client behind a NAT (or a public peer relaying) needs
        out["network.use_relay"] = True
    if client_mode:
        out["network.use_auto_relay"] = True
    return out


def check_public_ip(public_ip: Optional[str]) -> None:
    """A hostname here would reach hivemind as a malformed multiaddr (a TypeError, then a hang)."""
    if public_ip is None:
        return
    try:
        ip = ipaddress.ip_address(public_ip)
    except ValueError:
        raise UserError(f"--public-ip must be an IP address like 203.0.113.7, not {public_ip!r}",
                        "pass this machine's public IPv4 address, or leave --public-ip out for a swarm on this "
                        "machine or LAN") from None
    if ip.version != 4:
        raise UserError(f"--public-ip must be an IPv4 address, not {public_ip!r}",
                        f"announce an IPv6 address with --announce-maddr /ip6/{public_ip}/tcp/PORT")


def nat_default(host: str, public_ip: Optional[str]) -> bool:
    """UPnP/NAT-PMP asks the router to open a port to the internet: worth it only for a real internet
    join, not on loopback nor for a public IP that is not global (a LAN, link-local or test address)."""
    if public_ip:
        return ipaddress.ip_address(public_ip).is_global
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host != "localhost"
