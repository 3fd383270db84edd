"""The DHT process: hivemind's DHT (a forked process with its p2pd) started with the swarm's
validators, ending with the node's process, and callable from several threads at once.
"""

from __future__ import annotations

import os
import threading

from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator

from swarm.identity import Identity
from swarm.lifetime import end_with_parent
from swarm.dht.network import NetworkConfig, SwarmConnectError, listen_maddr
from swarm.dht.storage import CACHE_ROWS
from swarm.dht.storage import install as install_storage
from swarm.dht.validation import OwnerValidator


def create_dht(identity: Identity, net: NetworkConfig, swarm: str) -> DHT:
    """Start the DHT (a forked process with its p2pd). Create it before CUDA is initialised."""
    validators = swarm_validators(identity, swarm)
    announce = list(net.announce_maddrs) + ([f"/ip4/{net.public_ip}/tcp/{net.port}"] if net.public_ip else [])
    try:
        return _dht(identity, net, validators, announce)
    except Exception as e:  # hivemind reports both as a failed daemon start
        if "bootstrap peers" in str(e):
            raise SwarmConnectError(f"could not reach any of the initial peers {', '.join(net.initial_peers)}",
                                    "check the address and that the bootstrap peer is running and reachable "
                                    "(firewall, port); a coordinator prints the address to use") from None
        if "address already in use" in str(e).lower():
            raise SwarmConnectError(f"port {net.port} on {net.host} is already in use",
                                    "pick another --port, or 0 for any free one") from None
        raise


def swarm_validators(identity: Identity, swarm: str) -> list:
    """What every peer checks of the swarm's DHT records: signatures, the schema, owners."""
    return [RSASignatureValidator(identity.dht_private_key()), OwnerValidator(swarm)]


class _DHT(DHT):
    """hivemind's DHT, whose process and p2pd end when the node's process does (swarm/lifetime.py),
    callable from several threads at once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # every call is a message down one pipe to the DHT process, and a Connection is not safe
        # for two threads: a message over 16 KiB (a tally) goes in two writes that another
        # thread's can split. A role's heartbeat, its fetcher's announcer and its loop all call
        self._outer_pipe = _LockedSend(self._outer_pipe)

    def run(self) -> None:  # the DHT's own process
        end_with_parent()
        install_storage()  # its storage and cache budgeted, its pushes to newcomers bounded (storage.py)
        self._inner_pipe = _BlockingRecv(self._inner_pipe)
        super().run()


class _LockedSend:
    """A pipe's sending end whose `send` one thread at a time may use (the rest passes through)."""

    def __init__(self, conn) -> None:
        self._conn, self._lock = conn, threading.Lock()

    def send(self, obj) -> None:
        with self._lock:
            self._conn.send(obj)

    def close(self) -> None:  # not while another thread is halfway through a message
        with self._lock:
            self._conn.close()

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


class _BlockingRecv:
    """The DHT process's receiving end, read whole. hivemind's loop watches the pipe with
    `loop.add_reader`, which makes its descriptor non-blocking; `Connection.recv` then fails with
    EAGAIN partway through any message longer than the pipe's buffer (64 KiB: a tally of a few
    hundred peers), and every message after it is read from the middle: the DHT process died on
    the first large tally a learner published. Each message is read in blocking mode (the sender
    is writing it now), and the descriptor left non-blocking for the loop."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def recv(self):
        fd = self._conn.fileno()
        os.set_blocking(fd, True)
        try:
            return self._conn.recv()
        finally:
            os.set_blocking(fd, False)

    def __getattr__(self, name: str):
        return getattr(self._conn, name)


def _dht(identity: Identity, net: NetworkConfig, validators: list, announce: list[str] | None) -> DHT:
    return _DHT(
        initial_peers=net.initial_peers or None, start=True, record_validators=validators,
        identity_path=str(identity.path), host_maddrs=[listen_maddr(net.host, net.port)],
        announce_maddrs=announce or None, nat_port_map=net.nat_port_map, use_relay=net.use_relay,
        use_auto_relay=net.use_auto_relay, client_mode=net.client_mode, startup_timeout=30, cache_size=CACHE_ROWS,
        # behind a NAT: ask for a relay at once rather than after AutoNAT's verdict (which 1.1.12's
        # daemon got wrong for a NAT'd peer: docs/DESIGN.md, "Dependencies")
        force_reachability="private" if net.client_mode and net.use_auto_relay else None,
    )
