"""`hetero-node`: join a swarm that post-trains a language model with RL, or try it locally.

Commands import torch/transformers lazily, inside the command, so `hetero-node --help` is instant.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    help="hetero-node: post-train a language model with RL on a swarm of volunteer machines.\n\n"
         "Start with `hetero-node demo`: a whole learning run on a built-in tiny model, on CPU.",
    no_args_is_help=True,
    add_completion=False,
)


def _setup_logging(verbose: bool) -> None:
    from rich.logging import RichHandler

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s",
                        handlers=[RichHandler(show_path=False, rich_tracebacks=True)])
    for noisy in ("httpx", "urllib3", "filelock", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def demo(
    steps: int = typer.Option(250, help="Learner versions to train (about 3 per second on 2 CPU cores)."),
    samplers: int = typer.Option(2, help="Sampler processes."),
    workdir: Optional[Path] = typer.Option(None, help="Keep logs, checkpoints and metrics here (default: a temp folder)."),
    timeout: float = typer.Option(1200.0, help="Give up after this many seconds."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run a whole swarm on this machine: a bootstrap peer, a learner and samplers as real processes.

    They talk over hivemind on 127.0.0.1 only, with the built-in tiny model and arithmetic task;
    the learner trains on the samplers' rollouts (GEPO for stale ones) and publishes new versions
    that the samplers load. Shows live progress and ends with a summary. Every process it started
    is stopped when it ends, also on Ctrl-C. For a single-process run, see `hetero-node local`.
    """
    _setup_logging(verbose)
    from cli.swarm_demo import run_demo

    raise typer.Exit(run_demo(steps, samplers, workdir, timeout))


@app.command()
def local(
    config: Optional[Path] = typer.Option(None, "--config", "-c", exists=True, dir_okay=False,
                                          help="TOML file with LocalConfig fields (see examples/local.toml)."),
    model: Optional[str] = typer.Option(None, help="HF model id or local path; default the built-in tiny model."),
    algorithm: Optional[str] = typer.Option(None, help="gepo, grpo, dr_grpo, gspo or ftis."),
    steps: Optional[int] = typer.Option(None),
    lr: Optional[float] = typer.Option(None),
    time_budget: Optional[float] = typer.Option(None, help="Seconds."),
    metrics: Optional[Path] = typer.Option(None, help="Per-step metrics, JSONL."),
    seed: Optional[int] = typer.Option(None),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Single-process on-policy RL with any model and task: config file first, then these flags."""
    _setup_logging(verbose)
    from node.config import load_config
    from node.local import LocalConfig

    cfg = load_config(LocalConfig, config, {
        "model": model, "algorithm": algorithm, "steps": steps, "lr": lr, "time_budget_s": time_budget,
        "metrics_path": str(metrics) if metrics else None, "seed": seed,
    })
    _run_local(cfg)


@app.command()
def simulate(
    config: Optional[Path] = typer.Option(None, "--config", "-c", exists=True, dir_okay=False,
                                          help="TOML file with SimulatorConfig fields (see examples/simulate.toml)."),
    steps: Optional[int] = typer.Option(None, help="Learner steps."),
    max_delay: Optional[int] = typer.Option(None, help="Cap on weight delays, in learner steps (0 = online)."),
    stale_loss: Optional[str] = typer.Option(None, help="Loss for the learner's own stale rollouts: gepo, grpo, gspo, ..."),
    foreign_loss: Optional[str] = typer.Option(None, help="Loss for other models' rollouts: ftis, pg or drop."),
    metrics: Optional[Path] = typer.Option(None, help="Per-step metrics, JSONL."),
    seed: Optional[int] = typer.Option(None),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Simulate a swarm in one process: a learner, virtual samplers, injected WAN delays.

    The sampler and learner code is the real one; only the network is an in-memory exchange on a
    virtual clock. Deterministic under --seed. Prints eval accuracy and staleness as it goes.
    """
    _setup_logging(verbose)
    from dataclasses import replace

    from node.config import load_config
    from node.simulator import Simulator, SimulatorConfig

    cfg = load_config(SimulatorConfig, config, {"steps": steps, "max_delay_steps": max_delay, "seed": seed})
    learner_over = {"stale_loss": stale_loss, "foreign_loss": foreign_loss,
                    "metrics_path": str(metrics) if metrics else None}
    cfg.learner = replace(cfg.learner, **{k: v for k, v in learner_over.items() if v is not None})
    _run_with_progress(Simulator(cfg).run, cfg.steps, f"simulated swarm: {len(cfg.samplers)} sampler kinds, "
                       f"stale loss [cyan]{cfg.learner.stale_loss}[/], foreign [cyan]{cfg.learner.foreign_loss}[/]")


def _stop_on_signals():
    """A threading.Event set by SIGINT/SIGTERM; a second signal exits at once (children are
    reaped by their process group: see cli/procs.py)."""
    import os
    import signal
    import threading

    stop = threading.Event()

    def handler(signum, frame):
        if stop.is_set():
            from cli.procs import kill_descendants

            kill_descendants()  # forced: take our DHT process and p2pd down with us
            os._exit(130)
        logging.getLogger("hetero-node").info("stopping (signal %d); again to force", signum)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _network(host: str, port: int, public_ip: Optional[str], initial_peers: list[str], client_mode: bool,
             nat: Optional[bool], relay: bool):
    from swarm.dht import NetworkConfig

    loopback = host.startswith("127.") and not public_ip
    return NetworkConfig(host=host, port=port, public_ip=public_ip, initial_peers=list(initial_peers),
                         client_mode=client_mode, nat_port_map=(not loopback) if nat is None else nat,
                         use_relay=relay or client_mode, use_auto_relay=client_mode)


def _reachability_check(port: int, public_ip: Optional[str]) -> None:
    """Petals-style self-check: can this machine be reached at the address it announces?"""
    import socket

    if not public_ip:
        return
    try:
        with socket.create_connection((public_ip, port), timeout=3):
            logging.getLogger("hetero-node").info("reachability: %s:%d accepts connections", public_ip, port)
    except OSError as e:
        logging.getLogger("hetero-node").warning(
            "reachability: cannot connect to %s:%d (%s). Open TCP port %d in your firewall and forward it on "
            "your router to this machine, or run with --client-mode to reach the swarm through relays.",
            public_ip, port, e, port)


_PEERS_HELP = "Multiaddr of a bootstrap peer (repeat for several), e.g. /ip4/1.2.3.4/tcp/31337/p2p/Qm..."


@app.command()
def bootstrap(
    port: int = typer.Option(31337, help="TCP port to listen on (0 picks one)."),
    identity: Path = typer.Option(Path("bootstrap.key"), help="Identity file; created if missing. Keeps the peer id stable."),
    host: str = typer.Option("0.0.0.0", help="Listen address (0.0.0.0: all interfaces; 127.0.0.1: this machine only)."),
    public_ip: Optional[str] = typer.Option(None, help="Public IP to announce to peers."),
    swarm: str = typer.Option("demo", help="Swarm name (the DHT keys it serves)."),
    initial_peers: list[str] = typer.Option([], "--initial-peers", help="Other bootstrap peers to link with."),
    nat: Optional[bool] = typer.Option(None, "--nat/--no-nat", help="UPnP/NAT-PMP port mapping (default: on unless loopback)."),
    addr_file: Optional[Path] = typer.Option(None, help="Also write the multiaddrs to this file (for scripts)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run a coordinator's stable DHT entry point and print the multiaddr others pass as --initial-peers."""
    _setup_logging(verbose)
    from node.runner import run_bootstrap

    stop = _stop_on_signals()
    net = _network(host, port, public_ip, initial_peers, False, nat, relay=True)

    def ready(maddrs: list[str]) -> None:
        typer.echo("bootstrap peer ready; others join with:")
        for m in maddrs:
            typer.echo(f"  --initial-peers {m}")
        if addr_file:
            addr_file.write_text("\n".join(maddrs) + "\n")
        _reachability_check(port, public_ip)

    run_bootstrap(str(identity), net, swarm, stop, ready)


@app.command()
def join(
    role: str = typer.Option(..., help="sampler (generate rollouts) or learner (train on them)."),
    swarm: str = typer.Option("demo", help="Swarm name."),
    initial_peers: list[str] = typer.Option([], "--initial-peers", help=_PEERS_HELP),
    model: Optional[str] = typer.Option(None, help="Model to serve or train (HF id or path; default the built-in tiny model)."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", exists=True, dir_okay=False,
                                          help="TOML file with JoinConfig fields (see examples/join_sampler.toml)."),
    workdir: Optional[Path] = typer.Option(None, help="Identity, outbox, journal, checkpoints, metrics (default ./hetero-node-<role>)."),
    host: str = typer.Option("127.0.0.1", help="Listen address; 0.0.0.0 on an internet machine."),
    port: int = typer.Option(0, help="TCP port (0 picks a free one)."),
    public_ip: Optional[str] = typer.Option(None, help="Public IP to announce (listens on all interfaces)."),
    client_mode: bool = typer.Option(False, help="Behind NAT with no open port: outgoing connections and relays only."),
    nat: Optional[bool] = typer.Option(None, "--nat/--no-nat", help="UPnP/NAT-PMP port mapping (default: on unless loopback)."),
    follow: Optional[str] = typer.Option(None, help="Sampler: the learner peer id to follow (default: first found)."),
    engine: Optional[str] = typer.Option(None, help="Sampler: generation engine, 'hf' (default, runs anywhere) or "
                                         "'vllm' (needs the vllm extra; tune it under [vllm] in --config)."),
    name: Optional[str] = typer.Option(None, help="Sampler: display name on the leaderboard (public, max 64 chars)."),
    max_steps: Optional[int] = typer.Option(None, help="Learner: stop at this version."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Join a swarm as a sampler or a learner and work until stopped (Ctrl-C or SIGTERM: graceful)."""
    _setup_logging(verbose)
    from node.config import load_config
    from node.runner import JoinConfig, run_learner, run_sampler

    if public_ip and host.startswith("127."):
        host = "0.0.0.0"
    cfg = load_config(JoinConfig, config, {"role": role, "swarm": swarm, "model": model, "follow": follow,
                                           "max_steps": max_steps, "engine": engine, "name": name,
                                           "workdir": str(workdir) if workdir else f"hetero-node-{role}"})
    cfg.network = _network(host, port, public_ip, initial_peers or cfg.network.initial_peers, client_mode, nat,
                           relay=bool(public_ip) or client_mode)
    stop = _stop_on_signals()
    _reachability_check(port, public_ip)
    (run_learner if cfg.role == "learner" else run_sampler)(cfg, stop)


@app.command()
def leaderboard(
    serve: str = typer.Option("127.0.0.1:8080", help="HOST:PORT for the page and JSON API (port 0 picks one; "
                              "0.0.0.0:PORT to make it public)."),
    initial_peers: list[str] = typer.Option([], "--initial-peers", help=_PEERS_HELP + " Without any, only the "
                                            "stored history is served."),
    swarm: str = typer.Option("demo", help="Swarm name."),
    db: Path = typer.Option(Path("hetero-node-leaderboard/leaderboard.db"), help="SQLite history (kept across restarts)."),
    identity: Optional[Path] = typer.Option(None, help="Identity file for the DHT peer (default: next to --db)."),
    poll: float = typer.Option(10.0, help="Seconds between reads of the swarm's tallies."),
    trusted_learner: list[str] = typer.Option([], "--trusted-learner", help="Count only tallies from these learner "
                                              "peer ids (repeat); default: every learner's."),
    url_file: Optional[Path] = typer.Option(None, help="Also write the page's URL to this file (for scripts)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Serve the public leaderboard: per peer, the rollouts that learners accepted (from their signed tallies)."""
    _setup_logging(verbose)
    from node.runner import run_leaderboard

    host, _, port = serve.rpartition(":")
    if not host or not port.isdigit():
        raise typer.BadParameter("--serve takes HOST:PORT, e.g. 127.0.0.1:8080")
    net = _network("127.0.0.1", 0, None, initial_peers, False, False, relay=False) if initial_peers else None
    stop = _stop_on_signals()

    def ready(url: str) -> None:
        typer.echo(f"leaderboard at {url}")
        if url_file:
            url_file.write_text(url + "\n")

    run_leaderboard(str(db), swarm, host, int(port), net, str(identity or db.parent / "identity.key"), stop, poll,
                    set(trusted_learner) or None, ready)


@app.command()
def status(
    initial_peers: list[str] = typer.Option(..., "--initial-peers", help=_PEERS_HELP),
    swarm: str = typer.Option("demo", help="Swarm name."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Show the swarm as a table: peers, roles, models, versions, throughput, last seen."""
    import json
    import tempfile

    from rich.console import Console
    from rich.table import Table

    from swarm.dht import NetworkConfig, create_dht, list_peers
    from swarm.identity import Identity

    with tempfile.TemporaryDirectory() as tmp:
        ident = Identity.load_or_create(Path(tmp) / "status.key")
        dht = create_dht(ident, NetworkConfig(initial_peers=list(initial_peers), client_mode=True), swarm)
        try:
            peers = list_peers(dht, swarm)
        finally:
            dht.shutdown()
    if as_json:
        typer.echo(json.dumps(peers, indent=1))
        return
    from rich.markup import escape

    table = Table(title=f"swarm {escape(swarm)!r}: {len(peers)} peers")
    for col in ("peer", "name", "role", "model", "engine", "version", "throughput", "software", "last seen",
                "expires in"):
        table.add_column(col)
    for p in peers:  # names and models are other peers' text: never rich markup
        table.add_row(p["peer_id"][-12:], escape(p.get("name", "")), p["role"], escape(p["model_id"]),
                      escape(p["engine"]), str(p["version"]), f"{p['throughput']:.1f} compl/s", escape(p["software"]),
                      f"{p['last_seen_s']:.0f} s ago", f"{p['expires_in']:.0f} s")
    Console().print(table)


def _run_with_progress(run, total: int, title: str) -> list[dict]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    console.print(f"[bold]hetero-node[/] {title}")
    evals: list[tuple[int, float]] = []
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console) as progress:
        bar = progress.add_task("training", total=total, info="")

        def on_record(rec: dict) -> None:
            if rec["kind"] == "eval":
                evals.append((rec.get("version", rec.get("step")), rec["eval_acc"]))
                return
            info = f"reward {rec['reward']:.2f}"
            if "staleness_mean" in rec:
                info += f"  staleness {rec['staleness_mean']:.1f}"
            if evals:
                info += f"  eval {evals[-1][1]:.1%}"
            progress.update(bar, completed=rec.get("version", rec.get("step")), info=info)

        records = run(on_record)
    _print_evals(console, evals, records)
    return records


def _print_evals(console, evals: list[tuple[int, float]], records: list[dict]) -> None:
    from rich.table import Table

    table = Table(title="eval accuracy (greedy, held-out problems)")
    table.add_column("step", justify="right")
    table.add_column("accuracy", justify="right")
    for step, acc in evals:
        table.add_row(str(step), f"{acc:.1%}")
    console.print(table)
    before, after = evals[0][1], evals[-1][1]
    console.print(f"[bold]{before:.1%} -> {after:.1%}[/] ({(after - before) * 100:+.1f} points) at step {evals[-1][0]}, "
                  f"{records[-1]['time_s']:.0f} s")


def _run_local(cfg) -> None:
    from functools import partial

    from node.local import run_local

    _run_with_progress(partial(run_local, cfg), cfg.steps, f"local RL: model [cyan]{cfg.model}[/], loss "
                       f"[cyan]{cfg.algorithm}[/], {cfg.prompts_per_step} prompts x {cfg.group_size} completions per step")


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    app()
