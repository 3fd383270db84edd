"""A user's mistake gets one line: `error: <what> fix: <what to do>`, exit code 2.

Library code raises its own exception types that carry a `fix` (node.config.ConfigError,
node.models.ModelNotFoundError, swarm.dht.network.SwarmConnectError, `UserError` here); the CLI's entry
point turns those, and click's usage errors (bad flags), into that line. The traceback is shown
only with -v/--verbose. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

EXIT_USAGE = 2


class UserError(Exception):
    """A mistake in what the user asked for, found by the CLI itself."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.fix = fix


def is_usage_error(e: BaseException) -> bool:
    """click's UsageError (bad flags), from click or from the copy typer vendors."""
    return any(c.__name__ == "UsageError" for c in type(e).__mro__)


def is_user_error(e: BaseException) -> bool:
    """Our libraries' user-facing errors carry a `fix` (checked by duck type: importing their
    modules would pull in torch just to print one line)."""
    return is_usage_error(e) or isinstance(getattr(e, "fix", None), str)


def one_line(e: BaseException, command: str = "") -> str:
    help_hint = f"see `hetero-node {command} --help`".replace("  ", " ")
    if is_usage_error(e):
        what, fix = e.format_message(), help_hint
    else:
        what, fix = str(e), getattr(e, "fix", "") or help_hint
    what = " ".join(what.split()).replace("Value error, ", "").rstrip(". ")
    # one full stop between the two parts: none after a question or an exclamation already there
    return f"error: {what}{'' if what.endswith(('?', '!')) else '.'} fix: {' '.join(fix.split())}"


def report(e: BaseException, command: str, verbose: bool) -> int:
    if verbose:
        import traceback

        traceback.print_exception(e, file=sys.stderr)
    print(one_line(e, command), file=sys.stderr)
    return EXIT_USAGE
