"""cli: the `hetero-node` command (typer). Heavy imports happen inside commands, so --help is instant."""
