"""A rich progress bar over a run's metric records, and the eval table at its end."""

from __future__ import annotations

from typing import Callable
from node.metrics import Kind, Metric


def run_with_progress(run: Callable, total: int, title: str) -> list[dict]:
    """Call `run(on_record)`, showing version, reward, staleness and eval as records arrive."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console()
    console.print(f"[bold]hetero-node[/] {title}")
    evals: list[tuple[int, float]] = []
    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console) as progress:
        bar = progress.add_task("training", total=total, info="")

        last: dict = {}

        def on_record(rec: dict) -> None:  # an eval updates the line too: the bar ends on the final eval
            if rec[Metric.KIND] == Kind.EVAL:
                evals.append((rec[Metric.VERSION], rec[Metric.EVAL_ACC]))
            else:
                last.update(rec)
            if not last:
                return
            info = f"reward {last['reward']:.2f}"
            if "staleness_mean" in last:
                info += f"  staleness {last['staleness_mean']:.1f}"
            if evals:
                info += f"  eval {evals[-1][1]:.1%}"
            progress.update(bar, completed=last[Metric.VERSION], info=info)

        records = run(on_record)
    print_evals(console, evals, records)
    return records


def print_evals(console, evals: list[tuple[int, float]], records: list[dict]) -> None:
    from rich.table import Table

    table = Table(title="eval accuracy (greedy, held-out problems)")
    table.add_column("version", justify="right")
    table.add_column("accuracy", justify="right")
    for version, acc in evals:
        table.add_row(str(version), f"{acc:.1%}")
    console.print(table)
    before, after = evals[0][1], evals[-1][1]
    console.print(f"[bold]{before:.1%} -> {after:.1%}[/] ({(after - before) * 100:+.1f} points) at version "
                  f"{evals[-1][0]}, {records[-1]['time_s']:.0f} s")
