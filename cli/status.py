"""`hetero-node status`: who is in a swarm, read from the DHT with a throwaway identity."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer


def show_status(initial_peers: list[str], swarm: str, as_json: bool) -> None:
    import msgspec

    from node.config import load_config
    from swarm.dht.network import NetworkConfig
    from swarm.dht.process import create_dht
    from swarm.dht.records import list_peers
    from swarm.identity import Identity

    net = load_config(NetworkConfig, None, {"initial_peers": initial_peers, "client_mode": True})
    with tempfile.TemporaryDirectory() as tmp:
        dht = create_dht(Identity.load_or_create(Path(tmp) / "status.key"), net, swarm)
        try:
            listed = list_peers(dht, swarm)
        finally:
            dht.shutdown()
    peers = [{**msgspec.to_builtins(p.info), "expires_in": p.expires_in, "last_seen_s": p.last_seen_s} for p in listed]
    if as_json:
        typer.echo(json.dumps(peers, indent=1))
    else:
        print_table(peers, swarm)


def print_table(peers: list[dict], swarm: str) -> None:
    from rich.console import Console

    console = Console()
    if not peers:
        from rich.markup import escape

        console.print(f"swarm {escape(swarm)!r} has no live peers: the bootstrap peer answered, but nobody has "
                      f"announced under that name. Check --swarm (case-sensitive; the coordinator knows it).")
        return
    console.print(status_table(peers, swarm, console.width))
    if all(p["role"] == "bootstrap" for p in peers):
        console.print("only bootstrap peers so far: no sampler or learner has joined this swarm yet")


FOLDED = {"name": 20, "software": 18}
"""Columns of other peers' free text fold beyond this width."""
NAME_MIN = 8
"""A display name folds to this width before a model id folds."""


def status_table(peers: list[dict], swarm: str, width: int):
    """The peers as a rich Table for a terminal `width` columns wide.

    Model ids are what a user copies into --model, so they are never cut: on one line where the
    other columns leave room for the longest, else folded over lines, whole. The software version
    gets a column only when peers differ in it (else one line under the table), to leave that room.
    Column widths are set here, not left to rich, which would rather squash a column to nothing."""
    from rich import box
    from rich.cells import cell_len
    from rich.markup import escape
    from rich.table import Table

    from swarm.identity import short_id
    from swarm.wire.text import printable

    software = sorted({printable(p["software"]) for p in peers})
    rows = [{"peer": short_id(p["peer_id"]), "name": p.get("name", ""), "role": p["role"], "model": p["model_id"],
             "engine": p["engine"], "version": str(p["version"]), "rollouts/s": f"{p['throughput']:.1f}",
             "software": p["software"], "seen": f"{p['last_seen_s']:.0f} s ago"} for p in peers]
    rows = [{c: printable(v) for c, v in r.items()} for r in rows]  # other peers' text: escaped, never acted on
    columns = [c for c in rows[0] if c != "software" or len(software) > 1]
    widths = {c: min(max(len(c), *(cell_len(r[c]) for r in rows)), FOLDED.get(c, width)) for c in columns}
    # the model first, then the name, share what the fixed columns leave (2: the gap between two columns)
    room = width - sum(w for c, w in widths.items() if c not in ("model", "name")) - 2 * (len(columns) - 1)
    widths["model"] = min(widths["model"], max(room - min(widths["name"], NAME_MIN), 16))
    widths["name"] = min(widths["name"], max(room - widths["model"], NAME_MIN // 2))
    table = Table(title=f"swarm {escape(swarm)!r}: {len(peers)} peers", box=box.SIMPLE_HEAD, collapse_padding=True,
                  pad_edge=False, show_edge=False,
                  caption=None if len(software) > 1 else f"software: {escape(software[0])}")
    for c in columns:
        table.add_column(c, width=widths[c], overflow="fold",
                         justify="right" if c in ("version", "rollouts/s", "seen") else "left")
    for r in rows:  # names, models, engines and software are other peers' text: never rich markup
        table.add_row(*(escape(r[c]) for c in columns))
    return table
