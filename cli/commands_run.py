"""Try it on one machine: `demo` (a whole swarm as processes), `local` (one process, on-policy) and
`simulate` (a swarm in one process, on a virtual clock)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.app import app, as_str, load, setup_logging
from cli.options import (ConfigOpt, DeviceOpt, DtypeOpt, Loss, MetricsOpt, RouteLoss, SeedOpt, TensorboardOpt,
                      VerboseOpt)
from cli.paths import claim_dir, writable_dir, writable_file
from cli.progress import run_with_progress


@app.command()
def demo(
    steps: Annotated[int, typer.Option(min=1, help="Learner versions to train (about 5 per second on 2 CPU cores).")] = 200,
    samplers: Annotated[int, typer.Option(min=1, max=16, help="Sampler processes.")] = 2,
    workdir: Annotated[Optional[Path], typer.Option(help="Keep logs, checkpoints and metrics here (default: a temp folder).")] = None,
    timeout: Annotated[float, typer.Option(min=1, help="Give up after this many seconds.")] = 1200.0,
    verbose: VerboseOpt = False,
) -> None:
    """Run a whole swarm on this machine: a bootstrap peer, a learner and samplers as real processes.

    They talk over hivemind on 127.0.0.1 only, with the built-in tiny model and arithmetic task;
    the learner trains on the samplers' rollouts (gepo_lenclip for its own model's) and publishes new versions
    that the samplers load. Shows live progress and ends with a summary. Every process it started
    is stopped when it ends, also on Ctrl-C. For a single-process run, see `hetero-node local`.
    """
    # "gepo_lenclip": the learner's default own_loss (node.learner.LearnerConfig; a test keeps the two equal)
    claim = claim_dir(workdir, "--workdir", "demo") if workdir else None  # held until the demo ends
    setup_logging(verbose)
    from cli.demo import run_demo

    raise typer.Exit(run_demo(steps, samplers, workdir, timeout))


@app.command()
def local(
    config: ConfigOpt = None,
    model: Annotated[Optional[str], typer.Option(help="HF model folder or hub id (default: the built-in tiny model).")] = None,
    algorithm: Annotated[Optional[Loss], typer.Option(help="The loss (sets learner.own_loss).")] = None,
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
    setup_logging(verbose)
    from node.device import resolve
    from node.local import LocalConfig, run_local
    from node.models import resolve_model_path

    cfg = load(LocalConfig, config, {
        "model": model, "learner.own_loss": algorithm, "steps": steps, "learner.lr": lr,
        "time_budget_s": time_budget, "metrics_path": as_str(metrics), "tensorboard_dir": as_str(tensorboard),
        "seed": seed, "device": device, "dtype": dtype,
    })
    _check_outputs(cfg)
    resolve_model_path(cfg.model)  # a wrong path fails now, in one line, not after the imports
    resolve(cfg.device, cfg.dtype)  # so does a GPU this machine does not have
    run_with_progress(partial(run_local, cfg), cfg.steps, f"local RL: model [cyan]{cfg.model}[/], loss "
                      f"[cyan]{cfg.learner.own_loss}[/], {cfg.learner.groups_per_step} prompts x "
                      f"{cfg.sampling.group_size} completions per step")


@app.command()
def simulate(
    config: ConfigOpt = None,
    steps: Annotated[Optional[int], typer.Option(min=1, help="Learner steps.")] = None,
    max_delay: Annotated[Optional[int], typer.Option(min=0, help="Cap on weight delays, in learner steps (0 = online).")] = None,
    own_loss: Annotated[Optional[RouteLoss], typer.Option(
        "--own-loss", "--stale-loss", help="Loss for the learner's own model's rollouts, of any version (sets "
                                           "learner.own_loss; --stale-loss is its old name).")] = None,
    foreign_loss: Annotated[Optional[RouteLoss], typer.Option(help="Loss for other models' rollouts.")] = None,
    metrics: MetricsOpt = None,
    tensorboard: TensorboardOpt = None,
    seed: SeedOpt = None,
    model: Annotated[Optional[str], typer.Option(help="HF model folder or hub id (default: the built-in tiny model).")] = None,
    device: DeviceOpt = None,
    dtype: DtypeOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Simulate a swarm in one process: a learner, virtual samplers, injected WAN delays.

    The sampler and learner code is the real one; only the network is an in-memory exchange on a
    virtual clock. Deterministic under --seed. Prints eval accuracy and staleness as it goes.
    """
    setup_logging(verbose)
    from cli.config import SimulatorConfig
    from cli.simulate import Simulator
    from node.device import resolve
    from node.models import resolve_model_path

    cfg = load(SimulatorConfig, config, {
        "steps": steps, "max_delay_steps": max_delay, "seed": seed, "learner.own_loss": own_loss,
        "learner.foreign_loss": foreign_loss, "metrics_path": as_str(metrics), "tensorboard_dir": as_str(tensorboard),
        "model": model, "device": device, "dtype": dtype})
    _check_outputs(cfg)
    resolve_model_path(cfg.model)  # a wrong path fails now, in one line, not after the imports
    resolve(cfg.device, cfg.dtype)  # so does a GPU this machine does not have
    run_with_progress(Simulator(cfg).run, cfg.steps, f"simulated swarm: {len(cfg.samplers)} sampler kinds, "
                      f"own loss [cyan]{cfg.learner.own_loss}[/], foreign [cyan]{cfg.learner.foreign_loss}[/]")


def _check_outputs(cfg) -> None:
    """local's and simulate's output paths (from flags or the config file), before the model loads."""
    if cfg.metrics_path:
        writable_file(cfg.metrics_path, "--metrics")
    if cfg.tensorboard_dir:
        writable_dir(cfg.tensorboard_dir, "--tensorboard")
