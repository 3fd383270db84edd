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
    algorithm: str = typer.Option("gepo", help="Loss: gepo, grpo, dr_grpo, gspo or ftis."),
    steps: int = typer.Option(400, help="Optimizer steps (about 6 per second on 2 CPU cores)."),
    time_budget: float = typer.Option(180.0, help="Stop after this many seconds; a final eval still runs."),
    metrics: Optional[Path] = typer.Option(None, help="Write per-step metrics (JSONL) here."),
    seed: int = typer.Option(0),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Train the built-in tiny model on arithmetic with RL, on this CPU, and show eval accuracy rise.

    Runs the single-process learning loop (one policy samples, scores and trains). Takes about a
    minute on 2 cores; the swarm version (samplers and a learner as separate peers) comes with
    `hetero-node join`.
    """
    _setup_logging(verbose)
    from node.local import LocalConfig

    _run_local(LocalConfig(algorithm=algorithm, steps=steps, time_budget_s=time_budget, seed=seed,
                           metrics_path=str(metrics) if metrics else None))


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
