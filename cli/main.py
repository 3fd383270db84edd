"""`hetero-node`: join a swarm that post-trains a language model with RL, or try it locally.

The console entry point (`main`). The app is cli/app.py; its commands register from
cli/commands_run.py (demo, local, simulate), cli/commands_swarm.py (bootstrap, join, peer-id,
leaderboard, status) and cli/commands_tools.py (plot, init, doctor), imported here in the order
`hetero-node --help` lists them; cli/options.py holds the option types they share.

Commands import torch/transformers lazily, inside the command, so `hetero-node --help` is instant.
Flags are checked by click (types, ranges, choices: all shown in `--help`), config files by
node.config, both before any model is loaded or any peer contacted; a mistake ends in one line
(cli/errors.py), the traceback only with -v.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from cli import commands_run, commands_swarm, commands_tools  # noqa: F401  (registers the commands, in this order)
from cli.app import app
from cli.errors import is_user_error, report
from cli.network import network_overrides as _network  # noqa: F401  (tests/unit/cli/test_cli_paths.py)
from cli.options import LOSSES  # noqa: F401  (tests/unit/cli/test_config_cli.py)

__all__ = ["LOSSES", "app", "main"]


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
