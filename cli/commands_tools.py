"""Files: `plot` (runs' metrics to PNGs) and `init` (an example config to edit)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

from cli.app import app
from cli.errors import UserError
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
