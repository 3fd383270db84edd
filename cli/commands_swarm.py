"""The real swarm: `bootstrap` (a coordinator's entry point), `join` (a sampler or a learner),
`peer-id`, `leaderboard` and `status`. What they run lives in cli/roles.py, cli/status.py and swarm/."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from cli.app import app, as_str, load, setup_logging
from cli.errors import UserError
from cli.network import check_public_ip, nat_default, network_overrides
from cli.options import (AnnounceOpt, ConfigOpt, DeviceOpt, DtypeOpt, HostOpt, NatOpt, PeersOpt, PortOpt, PublicIpOpt,
                      SwarmOpt, VerboseOpt)
from cli.paths import claim_dir, claim_file, writable_file


@app.command()
def bootstrap(
    port: PortOpt = 31337,
    identity: Annotated[Path, typer.Option(help="Identity file; created if missing. Keeps the peer id stable.")] = Path("bootstrap.key"),
    host: HostOpt = "0.0.0.0",
    public_ip: PublicIpOpt = None,
    swarm: SwarmOpt = "demo",
    initial_peers: Annotated[list[str], typer.Option("--initial-peers", metavar="<multiaddr>", help="Other bootstrap peers to link with (repeat).")] = [],
    nat: NatOpt = None,
    addr_file: Annotated[Optional[Path], typer.Option(help="Also write the multiaddrs to this file (for scripts).")] = None,
    trusted_learner: Annotated[list[str], typer.Option("--trusted-learner", metavar="<peer id>[=<model>]", help="Peer id of a learner this "
                                                       "swarm's samplers may follow (repeat), optionally with the model it trains "
                                                       "(samplers follow their own model's learner and feed the others that take "
                                                       "their model); signed into the swarm record.")] = [],
    learners_file: Annotated[Optional[Path], typer.Option(help="Also name the learners listed in this file, one <peer id>[=<model>] "
                                                          "per line (# comments), re-read every 20 s: add a learner to a running "
                                                          "swarm by adding its line.")] = None,
    model: Annotated[str, typer.Option(help="The model id the swarm trains, in the swarm record (informational).")] = "",
    announce_maddr: AnnounceOpt = [],
    verbose: VerboseOpt = False,
) -> None:
    """Run a coordinator's stable DHT entry point and print the multiaddr others pass as --initial-peers.

    The coordinator signs the swarm record: the learners (--trusted-learner) samplers may follow.
    Samplers trust the record of the bootstrap peers they were given, and no other.
    """
    setup_logging(verbose)
    from swarm.dht.network import NetworkConfig

    from cli.procs import stop_on_signals
    from cli.roles import parse_learners, reachability_check, read_learners_file, run_bootstrap, tcp_port, volunteer_command

    check_public_ip(public_ip)  # before the NAT default reads it
    net = load(NetworkConfig, None, {k.split(".", 1)[1]: v for k, v in
                                     network_overrides(host, port, public_ip, initial_peers, False,
                                                       nat if nat is not None else nat_default(host, public_ip), True,
                                                       announce_maddr).items()})
    if addr_file:
        writable_file(addr_file, "--addr-file")
    learners = parse_learners(trusted_learner)
    if learners_file is not None and learners_file.exists():
        read_learners_file(learners_file)  # a malformed file stops us here, in one line, not in the loop
    elif learners_file is not None:
        typer.echo(f"the learners file {learners_file} does not exist yet: the bootstrap reads it every 20 s, "
                   "once it does")
    claim = claim_file(identity, "--identity", "bootstrap")  # one process per peer id; held until exit
    stop = stop_on_signals()

    def ready(maddrs: list[str]) -> None:
        typer.echo(f"bootstrap peer ready at {' '.join(maddrs)}")
        typer.echo("volunteers join with:")
        typer.echo(f"  {volunteer_command(maddrs, swarm, list(initial_peers))}")
        if not trusted_learner and learners_file is None:
            typer.echo("no learner is named yet: restart with --trusted-learner \"$(hetero-node peer-id "
                       "hetero-node-learner)\" for a learner whose --workdir is hetero-node-learner (the default)")
        if addr_file:
            addr_file.write_text("\n".join(maddrs) + "\n")
        reachability_check(port or tcp_port(maddrs), public_ip)  # port 0: the one picked for us

    run_bootstrap(str(identity), net, swarm, stop, ready, learners, model, learners_file)


@app.command()
def join(
    role: Annotated[Optional[Literal["sampler", "learner", "sampler,learner"]], typer.Option(
        help="sampler (generate rollouts), learner (train on them), or sampler,learner (both in one process on one "
             "device, sharing the weights); required here or in --config.")] = None,
    swarm: Annotated[Optional[str], typer.Option(help="Swarm name (default: the config's, else demo).")] = None,
    initial_peers: PeersOpt = [],
    model: Annotated[Optional[str], typer.Option(help="Model to serve or train: HF folder or hub id (default: a sampler runs the swarm's, "
                                                  "from its learner; a learner trains the built-in tiny model).")] = None,
    config: ConfigOpt = None,
    workdir: Annotated[Optional[Path], typer.Option(help="Identity, outbox, journal, checkpoints, metrics (default ./hetero-node-<role>).")] = None,
    host: Annotated[Optional[str], typer.Option(help="Listen address: 127.0.0.1 (this machine only) or 0.0.0.0 (all "
                                                "interfaces; the default when a bootstrap is on another machine).")] = None,
    port: Annotated[Optional[int], typer.Option(min=0, max=65535, help="TCP port to listen on (default: the "
                                                "config's, else 0: a free one).")] = None,
    public_ip: PublicIpOpt = None,
    reachability: Annotated[Optional[Literal["auto", "public", "private"]], typer.Option(
        help="Whether peers can dial this machine: auto (ask the bootstrap; the default), public, or private "
             "(behind a NAT: a DHT client, reached through relays).")] = None,
    client_mode: Annotated[Optional[bool], typer.Option("--client-mode", help="Same as --reachability private.")] = None,
    nat: NatOpt = None,
    announce_maddr: AnnounceOpt = [],
    follow: Annotated[Optional[str], typer.Option(help="Sampler: the learner peer id to follow (default: the first found).")] = None,
    engine: Annotated[Optional[Literal["hf", "vllm"]], typer.Option(
        help="Sampler: generation engine, hf (runs anywhere) or vllm (GPU; the vllm extra; tune it in the \\[vllm] "
             "table of --config).")] = None,
    name: Annotated[Optional[str], typer.Option(help="Sampler: public display name on the leaderboard (at most 64 characters).")] = None,
    max_steps: Annotated[Optional[int], typer.Option(min=1, help="Learner: stop at this version.")] = None,
    nproc_per_node: Annotated[Optional[int], typer.Option(min=1, help="Learner: train on N processes (GPUs) with "
        "FSDP2; starts torchrun, whose rank 0 joins the swarm.")] = None,
    tensorboard: Annotated[Optional[bool], typer.Option("--tensorboard/--no-tensorboard", help="Learner: also write TensorBoard event files to WORKDIR/tensorboard.")] = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Join a swarm as a sampler or a learner and work until stopped (Ctrl-C or SIGTERM: graceful).

    Logs a status line every 30 s (status_every_s) and a summary when it stops.
    """
    setup_logging(verbose)
    from node.device import resolve
    from node.engines.vllm_settings import vllm_preflight
    from node.models import resolve_model_path

    from cli.procs import stop_on_signals
    from cli.config import JoinConfig
    from cli.roles import run_both, run_learner, run_sampler

    if public_ip and host and host.startswith("127."):
        host = "0.0.0.0"
    cfg = load(JoinConfig, config, {
        "role": role, "swarm": swarm, "model": model, "follow": follow, "max_steps": max_steps, "engine": engine,
        "name": name, "workdir": as_str(workdir), "tensorboard": tensorboard, "device": device, "dtype": dtype,
        "nproc_per_node": nproc_per_node,
        **network_overrides(host, port, public_ip, initial_peers, client_mode, nat, relay=bool(public_ip) or client_mode,
                            announce=announce_maddr, reachability=reachability)})
    _settle_join(cfg, role, config, nat, model)
    # one process per workdir (held until exit); torchrun's ranks > 0 run under rank 0's
    claim = claim_dir(cfg.workdir, "--workdir", "join") if os.environ.get("RANK", "0") == "0" else None
    if cfg.model:  # a sampler with none runs the swarm's (cli/roles/swarm_model.py)
        resolve_model_path(cfg.model)  # a wrong model fails now, before the swarm is joined
    resolve(cfg.device, cfg.dtype)  # so does a GPU this machine does not have
    if cfg.engine == "vllm" and cfg.role == "sampler":  # and a vLLM missing, or unable to use that device
        vllm_preflight(cfg.device)
    if os.environ.get("RANK", "0") == "0":  # and a machine that cannot hold the model (the swarm's: once known)
        from cli.doctor import refuse_unfit

        refuse_unfit(cfg)
    if cfg.nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        raise typer.Exit(_torchrun(cfg.nproc_per_node))
    stop = stop_on_signals()
    {"learner": run_learner, "sampler": run_sampler, "sampler,learner": run_both}[cfg.role](cfg, stop)


def _settle_join(cfg, role: Optional[str], config: Optional[Path], nat: Optional[bool], model: Optional[str]) -> None:
    """What join needs past the config's own checks: a role, a bootstrap peer to reach, and for a
    sampler given no model (no --model, none in --config), the swarm's: cfg.model "" (cli/roles/swarm_model.py)."""
    from node.config import read_toml

    if cfg.role == "sampler" and model is None and (config is None or "model" not in _toml_keys(config)):
        cfg.model = ""

    # the listen address is settled now (NetworkConfig: from the bootstraps, when not given)
    if nat is None and "nat_port_map" not in (read_toml(config).get("network", {}) if config is not None else {}):
        cfg.network.nat_port_map = nat_default(cfg.network.host, cfg.network.public_ip)
    if role is None and (config is None or "role" not in _toml_keys(config)):
        raise UserError("join needs a role", "add --role sampler, --role learner or --role sampler,learner "
                        "(or role = ... in --config)")
    if not cfg.network.initial_peers:  # alone, a node would wait forever for peers that cannot find it
        raise UserError("join needs the address of the swarm's bootstrap peer",
                        "pass --initial-peers /ip4/.../tcp/.../p2p/... as the coordinator's bootstrap prints it "
                        "(or try `hetero-node demo`, a whole swarm on this machine)")


def _toml_keys(path: Path) -> set[str]:
    from node.config import read_toml

    return set(read_toml(path))


def _torchrun(nproc: int) -> int:
    """This same command under torchrun, one process per rank; SIGINT/SIGTERM are passed on (each
    rank stops gracefully: rank 0 checkpoints, then releases the others)."""
    from cli.procs import die_with_parent

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "cli.main", *sys.argv[1:]]
    proc = subprocess.Popen(cmd, preexec_fn=die_with_parent())  # torchrun (and its ranks) die with us, even on -9
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: proc.send_signal(signal.SIGTERM if s == signal.SIGHUP else s))
    return proc.wait()


@app.command("peer-id")
def peer_id(
    path: Annotated[Path, typer.Argument(help="A node's --workdir (its identity.key) or an identity file (*.key); "
                                         "the key is made if missing.")] = Path("hetero-node-learner"),
) -> None:
    """Print the peer id of a node's identity key, making the key if needed.

    A coordinator names its learner before either starts:
    `hetero-node bootstrap --trusted-learner "$(hetero-node peer-id hetero-node-learner)"`, then
    `hetero-node join --role learner` in the same folder uses that key (its default --workdir).
    """
    from swarm.identity import Identity

    key = path if path.suffix == ".key" or path.is_file() else path / "identity.key"
    if not key.exists():
        writable_file(key, "PATH")

    try:
        typer.echo(Identity.load_or_create(key).peer_id)
    except ValueError as e:  # not libp2p's key message, or not a key in it
        raise UserError(f"{key} is not an identity key ({e})",
                        "pass a node's --workdir or the .key file it made; a missing one is made for you") from None


@app.command()
def leaderboard(
    serve: Annotated[str, typer.Option(help="HOST:PORT for the page and JSON API (port 0 picks one; 0.0.0.0:PORT makes it public).")] = "127.0.0.1:8080",
    initial_peers: Annotated[list[str], typer.Option("--initial-peers", metavar="<multiaddr>", help="Bootstrap peer multiaddr (repeat); "
                                                     "without any, only the stored history is served.")] = [],
    swarm: SwarmOpt = "demo",
    db: Annotated[Path, typer.Option(help="SQLite history (kept across restarts).")] = Path("hetero-node-leaderboard/leaderboard.db"),
    identity: Annotated[Optional[Path], typer.Option(help="Identity file for the DHT peer (default: next to --db).")] = None,
    poll: Annotated[float, typer.Option(min=2.0, help="Seconds between reads of the swarm's tallies (each asks the coordinators and the learners for newer records; at least 2: their directory doors take 1 call a second from a key).")] = 10.0,
    trusted_learner: Annotated[list[str], typer.Option("--trusted-learner", metavar="<peer id>", help="Count only tallies from these "
                                                       "learner peer ids (repeat); default: those the coordinators' swarm records name "
                                                       "(--initial-peers).")] = [],
    url_file: Annotated[Optional[Path], typer.Option(help="Also write the page's URL to this file (for scripts).")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Serve the public leaderboard: per peer, the rollouts that learners accepted (from their signed tallies)."""
    setup_logging(verbose)
    from swarm.identity import check_peer_id

    host, port = _host_port(serve)
    for peer in trusted_learner:
        check_peer_id(peer, "--trusted-learner")
    for path, flag in ((db, "--db"), (identity, "--identity"), (url_file, "--url-file")):
        if path is not None:
            writable_file(path, flag)
    claim = claim_dir(db.parent, "--db", "leaderboard")  # one server per history; held until exit
    from swarm.dht.network import NetworkConfig
    from swarm.identity import Identity
    from swarm.leaderboard import LeaderboardStore
    from swarm.leaderboard import serve as serve_board
    from swarm.p2p import SwarmNode

    from cli.procs import stop_on_signals

    net = load(NetworkConfig, None, {"initial_peers": list(initial_peers)}) if initial_peers else None
    _check_port_free(host, port)  # before joining the swarm: a busy port is the user's to fix
    stop = stop_on_signals()
    store = LeaderboardStore(db)
    node = SwarmNode(Identity.load_or_create(identity or db.parent / "identity.key"), net, swarm) if net else None

    def ready(url: str) -> None:
        typer.echo(f"leaderboard at {url}")
        if url_file:
            url_file.write_text(url + "\n")

    try:
        serve_board(store, swarm, host, port, stop, node, poll, set(trusted_learner) or None, ready)
    finally:
        if node is not None:
            node.shutdown()
        store.close()


def _host_port(serve: str) -> tuple[str, int]:
    """--serve's HOST:PORT, or [IPv6]:PORT: "[::1]:0" -> ("::1", 0)."""
    fix = "e.g. --serve 127.0.0.1:8080, or [::1]:8080 for IPv6 (port 0 picks a free one)"
    bracketed = serve.startswith("[") and "]:" in serve
    host, _, port = serve[1:].partition("]:") if bracketed else serve.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise UserError(f"--serve {serve!r} is not HOST:PORT", fix)
    if bracketed and ":" not in host:
        raise UserError(f"--serve {serve!r}: only an IPv6 address goes in brackets", fix)
    if not bracketed and ":" in host:
        raise UserError(f"--serve {serve!r}: an IPv6 address needs brackets", f"e.g. --serve [{host}]:{port}")
    return host, int(port)


def _check_port_free(host: str, port: int) -> None:
    """A busy port, or an address this machine does not have, is the user's to fix: say which."""
    from swarm.leaderboard.server import listen_socket

    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    address_fix = ("pass an address of this machine in --serve HOST:PORT, e.g. 127.0.0.1:8080 (this machine only) "
                   "or 0.0.0.0:8080 (all interfaces)")
    try:
        socket.getaddrinfo(host, port, socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    except socket.gaierror as e:  # a name that does not resolve (to an IPv4 address)
        raise UserError(f"cannot serve on {shown}: {host!r} does not resolve ({e.strerror or e})",
                        address_fix) from None
    try:
        with listen_socket(host, port):
            pass
    except OSError as e:
        why = os.strerror(e.errno) if e.errno and e.errno > 0 else str(e)
        raise UserError(f"cannot serve on {shown} ({why})",
                        address_fix if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT) else
                        "pick another port with --serve HOST:PORT (port 0 picks a free one)") from None


@app.command()
def status(
    initial_peers: Annotated[list[str], typer.Option("--initial-peers", metavar="<multiaddr>", help="Bootstrap peer multiaddr, e.g. "
                                                     "/ip4/1.2.3.4/tcp/31337/p2p/Qm... (repeat for several).")],
    swarm: SwarmOpt = "demo",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Show the swarm as a table: peers, roles, models, versions, throughput, last seen."""
    setup_logging(verbose)
    from cli.status import show_status

    show_status(list(initial_peers), swarm, as_json)
