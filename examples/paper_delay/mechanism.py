"""What the learner did in each cell of a grid, over the steps its primary metric reads: the
mechanism's diagnostics (docs/RESULTS.md, Protocol: descriptive, no test, no correction).

    python examples/paper_delay/mechanism.py     # the confirmation's runs -> docs/results/protocol/mechanism.md
    python examples/paper_delay/mechanism.py --folder replicate_chain_long --report mechanism_replicate.md

Every finished run (one with its summary) of the folder, from its step records (`<run>.jsonl`, what
the learner logs each step) at versions from the burn-in B on (protocol.burn_in: under a pinned lag
L, steps before L train on younger rollouts than the regime's). Per run, the steps' mean of each
share and weight, and the steps' median of k3 and the gradient norm (heavy-tailed: a few steps' k3
runs to hundreds); per cell, the mean and SD of those over its seeds.

- **clipped**: the share of the loss's units whose gradient its clip (or dual clip) removes:
  tokens for a token-level loss (GRPO), sequences for a sequence-level one (GEPO, GSPO).
- **drifted tokens**: tokens with |log p/q| > log 1.2, p the learner's policy and q the one that
  sampled them (node/algorithms/base.drift_stats): the same quantity for every loss.
- **k3**: the mean over tokens of k3 = e^d - d - 1, d = log q/p; a divergence score, not a KL.
- **p/q, A > 0 / A < 0**: the mean token weight on rows of positive and of negative advantage.
- **grad norm**: before clipping (the learner's `grad_norm`).
- **train reward**: the mean reward of the rollouts each step trained on (sampled L versions ago).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.paper_delay.protocol import burn_in, sd  # noqa: E402
from examples.paper_delay.reread import RESULTS, write  # noqa: E402
from examples.paper_delay.run import loss_and_options, own_route  # noqa: E402

SEQUENCE_LEVEL = ("gepo", "gspo")
"""Losses whose clip acts on a sequence's weight, so `clip_frac` is a share of sequences."""


@dataclass(frozen=True)
class Column:
    head: str
    key: str
    """The step record's key (own_route: or its own-model route's)."""
    median: bool = False
    """Median over a run's steps, not the mean (a heavy-tailed figure)."""
    scale: float = 1.0
    fmt: str = ".3f"


COLUMNS = (
    Column("clipped %", "clip_frac", scale=100, fmt=".2f"),
    Column("drifted tokens %", "drift_frac", scale=100, fmt=".2f"),
    Column("k3 (median)", "kl_k3", median=True, fmt=".2g"),
    Column("p/q, A > 0", "weight_mean_pos", fmt=".4f"),
    Column("p/q, A < 0", "weight_mean_neg", fmt=".4f"),
    Column("grad norm (median)", "grad_norm", median=True),
    Column("train reward %", "reward", scale=100, fmt=".1f"),
)


def run_figures(records: list[dict], steps: int, lag: int) -> dict[str, float]:
    """One run's figure per column over its step records at versions >= the burn-in."""
    start = burn_in(steps, lag)
    out = {}
    for c in COLUMNS:
        xs = [x for r in records if r.get("kind") == "step" and r["version"] >= start
              and (x := own_route(r, c.key)) is not None and x == x]
        out[c.key] = (statistics.median(xs) if c.median else statistics.fmean(xs)) if xs else float("nan")
    return out


def read_folder(folder: Path) -> dict[tuple[str, int], dict[int, dict[str, float]]]:
    """(loss, delay) -> seed -> the run's figures, for every run of `folder` with a summary."""
    cells: dict[tuple[str, int], dict[int, dict[str, float]]] = {}
    for p in sorted(folder.glob("*.summary.json")):
        s = json.loads(p.read_text())
        settings = s.get("settings", {})
        steps = settings.get("steps", s["steps"])
        lag = s["delay"] if settings.get("lag") else 0
        log = p.with_name(p.name.removesuffix(".summary.json") + ".jsonl")
        records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        cells.setdefault((s["loss"], s["delay"]), {})[s["seed"]] = run_figures(records, steps, lag)
    return cells


def unit(loss: str) -> str:
    return "sequences" if loss_and_options(loss)[0].startswith(SEQUENCE_LEVEL) else "tokens"


def _cell(values: list[float], c: Column) -> str:
    xs = [x * c.scale for x in values if x == x]
    if not xs:
        return "-"
    mean = statistics.fmean(xs)
    return f"{mean:{c.fmt}}" if len(xs) < 2 else f"{mean:{c.fmt}} ± {sd(xs):{c.fmt}}"


def table(cells: dict[tuple[str, int], dict[int, dict[str, float]]]) -> str:
    """One row per cell (by delay, then loss): seed mean ± SD of each column."""
    head = "| regime | loss | seeds | clipped unit | " + " | ".join(c.head for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (4 + len(COLUMNS))]
    for loss, delay in sorted(cells, key=lambda k: (k[1], k[0])):
        runs = cells[(loss, delay)]
        regime = "online" if delay == 0 else f"lag {delay}"
        values = " | ".join(_cell([r[c.key] for r in runs.values()], c) for c in COLUMNS)
        lines.append(f"| {regime} | {loss} | {len(runs)} | {unit(loss)} | {values} |")
    return "\n".join(lines)


def report(folder: str) -> str:
    cells = read_folder(RESULTS / folder)
    return (f"# The mechanism's diagnostics: docs/results/{folder}\n\n"
            f"Written by `python examples/paper_delay/mechanism.py` (its docstring defines each column). "
            f"Per run over its steps from the burn-in on; per cell, mean ± SD over its seeds. Descriptive: "
            f"no test, no correction.\n\n{table(cells)}\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", default="confirm_bf16_t600", help="a grid's folder under docs/results")
    p.add_argument("--report", default="mechanism.md", help="its file under docs/results/protocol")
    args = p.parse_args()
    write(args.report, report(args.folder))


if __name__ == "__main__":
    main()
