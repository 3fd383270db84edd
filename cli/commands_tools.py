"""Tools: `plot` (runs' metrics to PNGs), `init` (an example config to edit) and `doctor` (whether
this machine can take part, and in which role)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from cli.app import app, as_str, load, setup_logging
from cli.errors import UserError
from cli.options import ConfigOpt, DeviceOpt, DtypeOpt, PeersOpt, VerboseOpt
from cli.paths import writable_dir, writable_file


@app.command()
def plot(
    runs: Annotated[list[Path], typer.Argument(metavar="RUN", help="metrics.jsonl files or run folders (e.g. a --workdir).")],
    out: Annotated[Path, typer.Option(help="Folder for the PNGs.")] = Path("plots"),
) -> None:
    """Plot runs' metrics (reward, eval accuracy, staleness, importance weights, ...) to PNG files."""
    from cli.plot import plot_runs

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
    out = out or Path(f"{kind}.toml")
    if out.exists():
        raise UserError(f"{out} already exists", "remove it or pass another --out")
    writable_file(out, "--out")
    out.write_text(files("cli").joinpath("configs", f"{kind}.toml").read_text())
    typer.echo(f"wrote {out}; edit it and pass --config {out}")


@app.command()
def doctor(
    model: Annotated[Optional[str], typer.Option(help="The model to check: HF folder or hub id (only its config.json is "
                                                 "read: from the folder, or the hub cache; published Qwen3 sizes are "
                                                 "known by name; nothing is downloaded). Default: with --initial-peers, "
                                                 "the swarm's (its learner's files), else the built-in tiny model.")] = None,
    initial_peers: PeersOpt = [],
    swarm: Annotated[str, typer.Option(help="With --initial-peers: the swarm's name, as the coordinator's command "
                                       "gives it.")] = "demo",
    role: Annotated[Literal["sampler", "learner", "all"], typer.Option(
        help="The role to check; all: both (exit code 0 if either fits).")] = "all",
    engine: Annotated[Optional[Literal["hf", "vllm"]], typer.Option(
        help="A sampler's engine: hf or vllm (vLLM's automatic \\[vllm] settings are shown where it fits).")] = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    workdir: Annotated[Optional[Path], typer.Option(help="Where the node would keep its files: the disk checked "
                                                    "(default ./hetero-node-<role>).")] = None,
    config: ConfigOpt = None,
    table: Annotated[bool, typer.Option("--table", help="Print the README's table of what fits (Qwen3 sizes x "
                                        "24/48/80 GB GPUs, and RAM) and exit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the machine, the needs and the verdicts as JSON.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Check whether this machine can take part: its GPUs, RAM, disk and software against what each
    role needs for the model (budgets from --config), with the fix where something does not fit.

    With the coordinator's --initial-peers (and no --model), the swarm's own model, as its learner
    serves it, how peers reach this machine (public, or behind a NAT), and the rate from the learner.

    Exit code 0 when the role fits (with --role all: either), 2 when not, with a last line
    `error: ... fix: ...`. The same check runs in `join` (cli/doctor.py `check_machine`).
    """
    if table:
        from node.fit import fit_table

        typer.echo(fit_table())
        return
    setup_logging(verbose)
    from cli.config import JoinConfig
    from cli.doctor import run_doctor
    from node.fit import Role

    roles = [Role.SAMPLER, Role.LEARNER] if role == "all" else [Role(role)]
    cfg = load(JoinConfig, config, {"role": roles[0].value, "model": model, "engine": engine, "device": device,
                                    "dtype": dtype, "workdir": as_str(workdir), "swarm": swarm,
                                    **({"network.initial_peers": list(initial_peers), "network.nat_port_map": False}
                                       if initial_peers else {})})
    if initial_peers and model is None:  # the swarm's model: its learner's files (cli/doctor.py probe_swarm)
        cfg.model = ""
    run_doctor(cfg, roles, as_json, verbose)
