"""`hetero-node status`: who is in a swarm, read from the DHT with a throwaway identity."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer


def show_status(initial_peers: list[str], swarm: str, as_json: bool) -> None:
    from node.config import load_config
    from swarm.dht import NetworkConfig, create_dht, list_peers
    from swarm.identity import Identity

    net = load_config(NetworkConfig, None, {"initial_peers": initial_peers, "client_mode": True})
    with tempfile.TemporaryDirectory() as tmp:
        dht = create_dht(Identity.load_or_create(Path(tmp) / "status.key"), net, swarm)
        try:
            peers = list_peers(dht, swarm)
        finally:
            dht.shutdown()
    if as_json:
        typer.echo(json.dumps(peers, indent=1))
    else:
        print_table(peers, swarm)


def print_table(peers: list[dict], swarm: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from swarm.identity import short_id

    console = Console()
    if not peers:
        console.print(f"swarm {escape(swarm)!r} has no live peers: the bootstrap peer answered, but nobody has "
                      f"announced under that name. Check --swarm (case-sensitive; the coordinator knows it).")
        return
    table = Table(title=f"swarm {escape(swarm)!r}: {len(peers)} peers")
    for col in ("peer", "name", "role", "model", "engine", "version", "throughput", "software", "last seen",
                "expires in"):
        table.add_column(col)
    for p in peers:  # names and models are other peers' text: never rich markup
        table.add_row(short_id(p["peer_id"]), escape(p.get("name", "")), p["role"], escape(p["model_id"]),
                      escape(p["engine"]), str(p["version"]), f"{p['throughput']:.1f} rollouts/s", escape(p["software"]),
                      f"{p['last_seen_s']:.0f} s ago", f"{p['expires_in']:.0f} s")
    console.print(table)
    if all(p["role"] == "bootstrap" for p in peers):
        console.print("only bootstrap peers so far: no sampler or learner has joined this swarm yet")
