"""`hetero-node`: join a swarm that post-trains a language model with RL, or try it locally.

Commands import torch/transformers lazily, inside the command, so `hetero-node --help` is instant.
Flags are checked by click (types, ranges, choices: all shown in `--help`), config files by
node.config, both before any model is loaded or any peer contacted; a mistake ends in one line
(cli/errors.py), the traceback only with -v.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from typer.core import TyperGroup

from .errors import UserError, is_user_error, report
from .paths import claim_dir, claim_file, writable_dir, writable_file


def _flags_take_no_value(params: list) -> list:
    """A flag's help row shows no value type: typer's rich help would print `<bool>` after it."""
    for p in params:
        if getattr(p, "is_flag", False) and p.metavar is None:
            p.metavar = ""
    return params


class _Group(TyperGroup):
    """The command group, with flags shown without a value type, and an unknown command answered
    in one line (click's "Did you mean" is a second sentence, and suggests `<typo> --help`)."""

    def get_params(self, ctx):
        return _flags_take_no_value(super().get_params(ctx))

    def get_command(self, ctx, cmd_name):
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _flags_take_no_value(command.get_params(ctx))
        return command

    def resolve_command(self, ctx, args):
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            raise UserError(f"no such command {args[0]!r}", no_such_command_fix(args[0], list(self.commands)))
        return super().resolve_command(ctx, args)


def no_such_command_fix(name: str, commands: list[str]) -> str:
    from difflib import get_close_matches

    close = get_close_matches(name, commands, n=1)
    listed = "`hetero-node --help` lists the commands"
    return f"did you mean `hetero-node {close[0]}`? ({listed})" if close else listed


app = typer.Typer(
    cls=_Group,
    help="hetero-node: post-train a language model with RL on a swarm of volunteer machines.\n\n"
         "Start with `hetero-node demo`: a whole learning run on a built-in tiny model, on CPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

LOSSES = ("gepo", "grpo", "dr_grpo", "gspo", "m2po", "ftis", "pg")
"""Loss names (node.algorithms.ALGORITHMS; a test keeps the two equal without importing torch here)."""
Loss = Literal["gepo", "grpo", "dr_grpo", "gspo", "m2po", "ftis", "pg"]
RouteLoss = Literal["gepo", "grpo", "dr_grpo", "gspo", "m2po", "ftis", "pg", "drop"]

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
    help="Compute dtype: auto (a learner on a GPU: bfloat16; otherwise float32, samplers included, whose "
         "tokens learners audit in float32), float32 or bfloat16. Learners keep float32 master weights and "
         "optimizer state either way.")]


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        typer.echo(f"hetero-node {version('hetero-node')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """hetero-node: post-train a language model with RL on a swarm of volunteer machines."""


def _setup_logging(verbose: bool) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    # hivemind reads this when first imported (here and in its forked DHT process): its INFO lines
    # are about its own machinery, not the user's run
    os.environ.setdefault("HIVEMIND_LOGLEVEL", "DEBUG" if verbose else "WARNING")
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s",
                        handlers=[RichHandler(console=Console(stderr=True), show_path=False)])
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "hivemind"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose and noisy == "hivemind" else logging.WARNING)


def _load(cls, config: Optional[Path], overrides: dict):
    from node.config import ConfigKind, load_config

    kinds = [ConfigKind("hetero-node local", "node.local:LocalConfig", "hetero-node init local"),
             ConfigKind("hetero-node simulate", "cli.simulate:SimulatorConfig", "hetero-node init simulate"),
             ConfigKind("hetero-node join", "cli.roles:JoinConfig", "hetero-node init sampler")]
    return load_config(cls, config, overrides, kinds)


# ---- try it on one machine -----------------------------------------------------------------------

@app.command()
def demo(
    steps: Annotated[int, typer.Option(min=1, help="Learner versions to train (about 3 per second on 2 CPU cores).")] = 250,
    samplers: Annotated[int, typer.Option(min=1, max=16, help="Sampler processes.")] = 2,
    workdir: Annotated[Optional[Path], typer.Option(help="Keep logs, checkpoints and metrics here (default: a temp folder).")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Give up after this many seconds.")] = 1200.0,
    verbose: VerboseOpt = False,
) -> None:
    """Run a whole swarm on this machine: a bootstrap peer, a learner and samplers as real processes.

    They talk over hivemind on 127.0.0.1 only, with the built-in tiny model and arithmetic task;
    the learner trains on the samplers' rollouts (GEPO for stale ones) and publishes new versions
    that the samplers load. Shows live progress and ends with a summary. Every process it started
    is stopped when it ends, also on Ctrl-C. For a single-process run, see `hetero-node local`.
    """
    claim = claim_dir(workdir, "--workdir", "demo") if workdir else None  # held until the demo ends
    _setup_logging(verbose)
    from .demo import run_demo

    raise typer.Exit(run_demo(steps, samplers, workdir, timeout))


@app.command()
def local(
    config: ConfigOpt = None,
    model: Annotated[Optional[str], typer.Option(help="HF model folder or hub id (default: the built-in tiny model).")] = None,
    algorithm: Annotated[Optional[Loss], typer.Option(help="The loss (sets learner.stale_loss).")] = None,
    steps: Annotated[Optional[int], typer.Option(min=1, help="Optimizer steps.")] = None,
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (sets learner.lr; > 0).")] = None,
    time_budget: Annotated[Optional[float], typer.Option(help="Stop after this many seconds (> 0).")] = None,
    metrics: MetricsOpt = None,
    tensorboard: TensorboardOpt = None,
    seed: SeedOpt = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Single-process on-policy RL with any model and task: config file first, then these flags."""
    _setup_logging(verbose)
    from node.local import LocalConfig

    cfg = _load(LocalConfig, config, {
        "model": model, "learner.stale_loss": algorithm, "steps": steps, "learner.lr": lr,
        "time_budget_s": time_budget, "metrics_path": _str(metrics), "tensorboard_dir": _str(tensorboard), "seed": seed,
        "device": device, "dtype": dtype,
    })
    _check_outputs(cfg)
    from node.device import resolve
    from node.models import resolve_model_path

    resolve_model_path(cfg.model)  # a wrong path fails now, in one line, not after the imports
    resolve(cfg.device, cfg.dtype)  # so does a GPU this machine does not have
    from functools import partial

    from node.local import run_local

    from .progress import run_with_progress

    run_with_progress(partial(run_local, cfg), cfg.steps, f"local RL: model [cyan]{cfg.model}[/], loss "
                      f"[cyan]{cfg.learner.stale_loss}[/], {cfg.learner.groups_per_step} prompts x "
                      f"{cfg.sampling.group_size} completions per step")


@app.command()
def simulate(
    config: ConfigOpt = None,
    steps: Annotated[Optional[int], typer.Option(min=1, help="Learner steps.")] = None,
    max_delay: Annotated[Optional[int], typer.Option(min=0, help="Cap on weight delays, in learner steps (0 = online).")] = None,
    stale_loss: Annotated[Optional[RouteLoss], typer.Option(help="Loss for the learner's own stale rollouts.")] = None,
    foreign_loss: Annotated[Optional[RouteLoss], typer.Option(help="Loss for other models' rollouts.")] = None,
    metrics: MetricsOpt = None,
    tensorboard: TensorboardOpt = None,
    seed: SeedOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Simulate a swarm in one process: a learner, virtual samplers, injected WAN delays.

    The sampler and learner code is the real one; only the network is an in-memory exchange on a
    virtual clock. Deterministic under --seed. Prints eval accuracy and staleness as it goes.
    """
    _setup_logging(verbose)
    from .simulate import Simulator, SimulatorConfig

    cfg = _load(SimulatorConfig, config, {
        "steps": steps, "max_delay_steps": max_delay, "seed": seed, "learner.stale_loss": stale_loss,
        "learner.foreign_loss": foreign_loss, "metrics_path": _str(metrics), "tensorboard_dir": _str(tensorboard)})
    _check_outputs(cfg)
    from .progress import run_with_progress

    run_with_progress(Simulator(cfg).run, cfg.steps, f"simulated swarm: {len(cfg.samplers)} sampler kinds, "
                      f"stale loss [cyan]{cfg.learner.stale_loss}[/], foreign [cyan]{cfg.learner.foreign_loss}[/]")


def _check_outputs(cfg) -> None:
    """local's and simulate's output paths (from flags or the config file), before the model loads."""
    if cfg.metrics_path:
        writable_file(cfg.metrics_path, "--metrics")
    if cfg.tensorboard_dir:
        writable_dir(cfg.tensorboard_dir, "--tensorboard")


# ---- the real swarm -------------------------------------------------------------------------------

def _stop_on_signals():
    """A threading.Event set by SIGINT/SIGTERM; a second signal exits at once (children are
    reaped by their process group: see cli/procs.py)."""
    import signal
    import threading

    stop = threading.Event()

    from .procs import STOP_SIGNALS, force_exit

    def handler(signum, frame):
        if stop.is_set():
            force_exit(signum)  # forced: take our DHT process and p2pd down with us
        logging.getLogger("hetero-node").info("stopping (signal %d); again to force", signum)
        stop.set()

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    return stop


def _network(host: str, port: int, public_ip: Optional[str], initial_peers: list[str], client_mode: bool,
             nat: Optional[bool], relay: bool, announce: list[str] = (), reachability: Optional[str] = None) -> dict:
    """The [network] table's overrides from flags (validated with the rest of the config)."""
    _check_public_ip(public_ip)
    return {"network.host": host, "network.port": port, "network.public_ip": public_ip,
            "network.reachability": reachability,
            "network.initial_peers": list(initial_peers) or None, "network.client_mode": client_mode,
            "network.announce_maddrs": list(announce) or None,
            "network.nat_port_map": nat if nat is not None or host is None else _nat_default(host, public_ip),
            "network.use_relay": relay or client_mode, "network.use_auto_relay": client_mode}


def _check_public_ip(public_ip: Optional[str]) -> None:
    """A hostname here would reach hivemind as a malformed multiaddr (a TypeError, then a hang)."""
    import ipaddress

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


def _nat_default(host: str, public_ip: Optional[str]) -> bool:
    """UPnP/NAT-PMP asks the router to open a port to the internet: worth it only for a real internet
    join, not on loopback nor for a public IP that is not global (a LAN, link-local or test address)."""
    import ipaddress

    if public_ip:
        return ipaddress.ip_address(public_ip).is_global
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host != "localhost"


HostOpt = Annotated[str, typer.Option(help="Listen address: 127.0.0.1 (this machine only) or 0.0.0.0 (all interfaces).")]
PortOpt = Annotated[int, typer.Option(min=0, max=65535, help="TCP port to listen on (0 picks a free one).")]
PublicIpOpt = Annotated[Optional[str], typer.Option(metavar="<ip>", help="Public IPv4 address to announce to peers, e.g. "
                                                   "203.0.113.7 (then listens on all interfaces).")]
NatOpt = Annotated[Optional[bool], typer.Option("--nat/--no-nat", help="UPnP/NAT-PMP port mapping on your router "
                                                "(default: on, except on loopback or with a --public-ip that is not a "
                                                "global address, e.g. a LAN one).")]
AnnounceOpt = Annotated[list[str], typer.Option("--announce-maddr", metavar="<multiaddr>", help="Announce this multiaddr instead of the listen "
                                                "address, e.g. /ip4/1.2.3.4/tcp/31337 behind a port forward or proxy (repeat).")]


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
    _setup_logging(verbose)
    from swarm.dht import NetworkConfig

    from .roles import run_bootstrap

    net = _load(NetworkConfig, None, {k.split(".", 1)[1]: v for k, v in
                                      _network(host, port, public_ip, initial_peers, False, nat, True,
                                                       announce_maddr).items()})
    if addr_file:
        writable_file(addr_file, "--addr-file")
    from .roles import parse_learners, read_learners_file

    learners = parse_learners(trusted_learner)
    if learners_file is not None and learners_file.exists():
        read_learners_file(learners_file)  # a malformed file stops us here, in one line, not in the loop
    elif learners_file is not None:
        typer.echo(f"the learners file {learners_file} does not exist yet: the bootstrap reads it every 20 s, "
                   "once it does")
    claim = claim_file(identity, "--identity", "bootstrap")  # one process per peer id; held until exit
    stop = _stop_on_signals()

    def ready(maddrs: list[str]) -> None:
        from .roles import volunteer_command

        typer.echo(f"bootstrap peer ready at {' '.join(maddrs)}")
        typer.echo("volunteers join with:")
        typer.echo(f"  {volunteer_command(maddrs, swarm, list(initial_peers))}")
        if not trusted_learner and learners_file is None:
            typer.echo("no learner is named yet: restart with --trusted-learner \"$(hetero-node peer-id "
                       "hetero-node-learner)\" for a learner whose --workdir is hetero-node-learner (the default)")
        if addr_file:
            addr_file.write_text("\n".join(maddrs) + "\n")
        from .roles import reachability_check, tcp_port

        reachability_check(port or tcp_port(maddrs), public_ip)  # port 0: the one picked for us

    run_bootstrap(str(identity), net, swarm, stop, ready, learners, model, learners_file)


@app.command()
def join(
    role: Annotated[Optional[Literal["sampler", "learner", "sampler,learner"]], typer.Option(
        help="sampler (generate rollouts), learner (train on them), or sampler,learner (both in one process on one "
             "device, sharing the weights); required here or in --config.")] = None,
    swarm: Annotated[Optional[str], typer.Option(help="Swarm name (default: the config's, else demo).")] = None,
    initial_peers: PeersOpt = [],
    model: Annotated[Optional[str], typer.Option(help="Model to serve or train: HF folder or hub id (default: the built-in tiny model).")] = None,
    config: ConfigOpt = None,
    workdir: Annotated[Optional[Path], typer.Option(help="Identity, outbox, journal, checkpoints, metrics (default ./hetero-node-<role>).")] = None,
    host: Annotated[Optional[str], typer.Option(help="Listen address: 127.0.0.1 (this machine only) or 0.0.0.0 (all "
                                                "interfaces; the default when a bootstrap is on another machine).")] = None,
    port: PortOpt = 0,
    public_ip: PublicIpOpt = None,
    reachability: Annotated[Optional[Literal["auto", "public", "private"]], typer.Option(
        help="Whether peers can dial this machine: auto (ask the bootstrap; the default), public, or private "
             "(behind a NAT: a DHT client, reached through relays).")] = None,
    client_mode: Annotated[bool, typer.Option(help="Same as --reachability private.")] = False,
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
    _setup_logging(verbose)
    from .roles import JoinConfig, run_both, run_learner, run_sampler

    if public_ip and host and host.startswith("127."):
        host = "0.0.0.0"
    cfg = _load(JoinConfig, config, {
        "role": role, "swarm": swarm, "model": model, "follow": follow, "max_steps": max_steps, "engine": engine,
        "name": name, "workdir": _str(workdir), "tensorboard": tensorboard, "device": device, "dtype": dtype,
        "nproc_per_node": nproc_per_node,
        **_network(host, port, public_ip, initial_peers, client_mode, nat, relay=bool(public_ip) or client_mode,
                   announce=announce_maddr, reachability=reachability)})
    if nat is None:  # the listen address is settled now (NetworkConfig: from the bootstraps, when not given)
        cfg.network.nat_port_map = _nat_default(cfg.network.host, cfg.network.public_ip)
    if role is None and (config is None or "role" not in _toml_keys(config)):
        raise UserError("join needs a role", "add --role sampler, --role learner or --role sampler,learner "
                        "(or role = ... in --config)")
    if not cfg.network.initial_peers:  # alone, a node would wait forever for peers that cannot find it
        raise UserError("join needs the address of the swarm's bootstrap peer",
                        "pass --initial-peers /ip4/.../tcp/.../p2p/... as the coordinator's bootstrap prints it "
                        "(or try `hetero-node demo`, a whole swarm on this machine)")
    # one process per workdir (held until exit); torchrun's ranks > 0 run under rank 0's
    claim = claim_dir(cfg.workdir, "--workdir", "join") if os.environ.get("RANK", "0") == "0" else None
    from node.models import resolve_model_path

    from node.device import resolve

    resolve_model_path(cfg.model)  # a wrong model fails now, before the swarm is joined
    resolve(cfg.device, cfg.dtype)  # so does a GPU this machine does not have
    if cfg.nproc_per_node > 1 and "WORLD_SIZE" not in os.environ:
        raise typer.Exit(_torchrun(cfg.nproc_per_node))
    stop = _stop_on_signals()
    {"learner": run_learner, "sampler": run_sampler, "sampler,learner": run_both}[cfg.role](cfg, stop)


def _torchrun(nproc: int) -> int:
    """This same command under torchrun, one process per rank; SIGINT/SIGTERM are passed on (each
    rank stops gracefully: rank 0 checkpoints, then releases the others)."""
    import signal
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "cli.main", *sys.argv[1:]]
    from .procs import die_with_parent

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

    from google.protobuf.message import DecodeError

    key = path if path.suffix == ".key" or path.is_file() else path / "identity.key"
    if not key.exists():
        writable_file(key, "PATH")

    try:
        typer.echo(Identity.load_or_create(key).peer_id)
    except (ValueError, DecodeError) as e:
        raise UserError(f"{key} is not an identity key ({e})",
                        "pass a node's --workdir or the .key file it made; a missing one is made for you") from None


def _toml_keys(path: Path) -> set[str]:
    from node.config import read_toml

    return set(read_toml(path))


@app.command()
def leaderboard(
    serve: Annotated[str, typer.Option(help="HOST:PORT for the page and JSON API (port 0 picks one; 0.0.0.0:PORT makes it public).")] = "127.0.0.1:8080",
    initial_peers: Annotated[list[str], typer.Option("--initial-peers", metavar="<multiaddr>", help="Bootstrap peer multiaddr (repeat); "
                                                     "without any, only the stored history is served.")] = [],
    swarm: SwarmOpt = "demo",
    db: Annotated[Path, typer.Option(help="SQLite history (kept across restarts).")] = Path("hetero-node-leaderboard/leaderboard.db"),
    identity: Annotated[Optional[Path], typer.Option(help="Identity file for the DHT peer (default: next to --db).")] = None,
    poll: Annotated[float, typer.Option(min=0.1, help="Seconds between reads of the swarm's tallies.")] = 10.0,
    trusted_learner: Annotated[list[str], typer.Option("--trusted-learner", metavar="<peer id>", help="Count only tallies from these "
                                                       "learner peer ids (repeat); default: every learner's.")] = [],
    url_file: Annotated[Optional[Path], typer.Option(help="Also write the page's URL to this file (for scripts).")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Serve the public leaderboard: per peer, the rollouts that learners accepted (from their signed tallies)."""
    _setup_logging(verbose)
    host, port = _host_port(serve)
    for path, flag in ((db, "--db"), (identity, "--identity"), (url_file, "--url-file")):
        if path is not None:
            writable_file(path, flag)
    claim = claim_dir(db.parent, "--db", "leaderboard")  # one server per history; held until exit
    from swarm.dht import NetworkConfig
    from swarm.identity import Identity
    from swarm.leaderboard import LeaderboardStore
    from swarm.leaderboard import serve as serve_board
    from swarm.p2p import SwarmNode

    net = _load(NetworkConfig, None, {"initial_peers": list(initial_peers)}) if initial_peers else None
    _check_port_free(host, port)  # before joining the swarm: a busy port is the user's to fix
    stop = _stop_on_signals()
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
    host, _, port = serve.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise UserError(f"--serve {serve!r} is not HOST:PORT", "e.g. --serve 127.0.0.1:8080 (port 0 picks a free one)")
    return host, int(port)


def _check_port_free(host: str, port: int) -> None:
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        raise UserError(f"cannot serve on {host}:{port} ({e.strerror or e})",
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
    _setup_logging(verbose)
    from .status import show_status

    show_status(list(initial_peers), swarm, as_json)


# ---- files --------------------------------------------------------------------------------------

@app.command()
def plot(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN", help="metrics.jsonl files or run folders (e.g. a --workdir).")],
    out: Annotated[Path, typer.Option(help="Folder for the PNGs.")] = Path("plots"),
) -> None:
    """Plot runs' metrics (reward, eval accuracy, staleness, importance weights, ...) to PNG files."""
    from .plot import plot_runs

    writable_dir(out, "--out")
    try:
        written = plot_runs(list(runs), out)
    except FileNotFoundError as e:
        raise UserError(str(e).split("; ")[0], str(e).split("; ", 1)[1] if "; " in str(e) else
                        "pass a metrics.jsonl or a run folder") from None
    for path in written:
        typer.echo(str(path))


@app.command()
def init(
    kind: Annotated[Literal["sampler", "learner", "local", "simulate"], typer.Argument(
        help="Which config: sampler or learner (for join), local, simulate.")],
    out: Annotated[Optional[Path], typer.Option(help="File to write (default: ./<kind>.toml); never overwritten.")] = None,
) -> None:
    """Write a commented example config for a command, to edit and pass as --config."""
    from importlib.resources import files

    out = out or Path(f"{kind}.toml")
    if out.exists():
        raise UserError(f"{out} already exists", "remove it or pass another --out")
    writable_file(out, "--out")
    out.write_text(files("cli").joinpath("configs", f"{kind}.toml").read_text())
    typer.echo(f"wrote {out}; edit it and pass --config {out}")


def _str(p: Optional[Path]) -> Optional[str]:
    return str(p) if p is not None else None


def main(argv: Optional[list[str]] = None) -> int:
    """The console entry point: runs the app, and answers a user's mistake in one line."""
    args = sys.argv[1:] if argv is None else argv
    verbose = "-v" in args or "--verbose" in args
    command = next((a for a in args if not a.startswith("-")), "")
    try:
        return app(args=args, prog_name="hetero-node", standalone_mode=False) or 0
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except Exception as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # `hetero-node` alone: the help was printed
            return 0
        if is_user_error(e):
            return report(e, command, verbose)
        raise


if __name__ == "__main__":  # python -m cli.main (how the demo starts its nodes)
    sys.exit(main())
