"""The option types that several commands share, and the loss choices (one list, from the registry).

Each is an `Annotated` type for a command's signature; a command's own options stay in its signature.
Nothing here imports torch: `hetero-node --help` reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

LOSSES = ("gepo_lenclip", "gepo", "grpo", "dr_grpo", "grpo_seqmask", "gspo", "m2po", "tis", "ftis", "pg")
"""The registered losses (the names of node.algorithms.ALGORITHMS, whose import takes torch; a test
keeps the two equal), in the order `--help` lists them: the learner's default first."""
DROP = "drop"
"""The route that trains on nothing (node.learner.DROP; a test keeps the two equal)."""
ROUTES = (*LOSSES, DROP)
"""What a learner may do with a route's rollouts: train with a loss, or drop them."""

Loss = Literal[LOSSES]
RouteLoss = Literal[ROUTES]

ConfigOpt = Annotated[Optional[Path], typer.Option(
    "--config", "-c", exists=True, dir_okay=False,
    help="TOML config file (`hetero-node init` writes commented examples); flags override it.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Debug logs, and tracebacks on errors.")]
PeersOpt = Annotated[list[str], typer.Option(
    "--initial-peers", metavar="<multiaddr>", help="Multiaddr of a bootstrap peer, e.g. /ip4/1.2.3.4/tcp/31337/p2p/Qm... (repeat for several).")]
SwarmOpt = Annotated[str, typer.Option(help="Swarm name: the DHT keys this swarm's peers share (case-sensitive).")]
MetricsOpt = Annotated[Optional[Path], typer.Option(help="Per-step metrics, JSONL (plot with `hetero-node plot`).")]
TensorboardOpt = Annotated[Optional[Path], typer.Option(help="Also write TensorBoard event files to this folder.")]
SeedOpt = Annotated[Optional[int], typer.Option(help="Random seed (default: the config's, else 0).")]
DeviceOpt = Annotated[Optional[str], typer.Option(
    help="Where to compute: auto (a CUDA GPU where torch sees one, else the CPU), cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[Optional[str], typer.Option(
    help="Compute dtype: auto (bfloat16 on a GPU, float32 on the CPU), float32 or bfloat16. Learners keep "
         "float32 master weights and optimizer state either way; samplers' bfloat16 tokens pass the learner's "
         "audit by race margin.")]

# the network flags of `bootstrap` and `join` (cli/network.py turns them into [network] overrides)
HostOpt = Annotated[str, typer.Option(help="Listen address: 127.0.0.1 (this machine only) or 0.0.0.0 (all interfaces).")]
PortOpt = Annotated[int, typer.Option(min=0, max=65535, help="TCP port to listen on (0 picks a free one).")]
PublicIpOpt = Annotated[Optional[str], typer.Option(metavar="<ip>", help="Public IPv4 address to announce to peers, e.g. "
                                                   "203.0.113.7 (then listens on all interfaces).")]
NatOpt = Annotated[Optional[bool], typer.Option("--nat/--no-nat", help="UPnP/NAT-PMP port mapping on your router "
                                                "(default: on, except on loopback or with a --public-ip that is not a "
                                                "global address, e.g. a LAN one).")]
AnnounceOpt = Annotated[list[str], typer.Option("--announce-maddr", metavar="<multiaddr>", help="Announce this multiaddr instead of the listen "
                                                "address, e.g. /ip4/1.2.3.4/tcp/31337 behind a port forward or proxy (repeat).")]
