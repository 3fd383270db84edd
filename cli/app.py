"""The typer app and what every command shares: the command group, logging, config loading.

The commands register on `app` from cli/commands_*.py; cli/main.py imports them in their `--help` order.
"""

from __future__ import annotations

import logging
import os
from difflib import get_close_matches
from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from cli.errors import UserError


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


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        typer.echo(f"hetero-node {version('hetero-node')}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    """hetero-node: post-train a language model with RL on a swarm of volunteer machines."""


def setup_logging(verbose: bool) -> None:
    from rich.console import Console
    from rich.logging import RichHandler

    # hivemind reads this when first imported (here and in its forked DHT process): its INFO lines
    # are about its own machinery, not the user's run
    os.environ.setdefault("HIVEMIND_LOGLEVEL", "DEBUG" if verbose else "WARNING")
    from swarm.wire.text import PeerTextFilter

    handler = RichHandler(console=Console(stderr=True), show_path=False)
    handler.addFilter(PeerTextFilter())  # a peer's text in any line is escaped, not acted on by the terminal
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(message)s", handlers=[handler])
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "hivemind"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose and noisy == "hivemind" else logging.WARNING)


CONFIG_KINDS = (("hetero-node local", "node.local:LocalConfig", "hetero-node init local"),
                ("hetero-node simulate", "cli.config:SimulatorConfig", "hetero-node init simulate"),
                ("hetero-node join", "cli.config:JoinConfig", "hetero-node init sampler"))
"""node.config.ConfigKind's fields for each command's config files. Each class is named where it is
defined: node.config recognises a command's own kind by the class's __module__ (a test checks)."""


def load(cls, config: Optional[Path], overrides: dict):
    """`cls` from the config file, then the flags' overrides; a file meant for another command says which."""
    from node.config import ConfigKind, load_config

    return load_config(cls, config, overrides, [ConfigKind(*kind) for kind in CONFIG_KINDS])


def as_str(p: Optional[Path]) -> Optional[str]:
    return str(p) if p is not None else None
