"""What the learner did in each cell of a grid once its regime had begun: the mechanism's
diagnostics (docs/RESULTS.md, Protocol: descriptive, no test, no correction).

    python examples/paper_delay/mechanism.py     # the confirmation's runs -> docs/results/protocol/mechanism.md
    python examples/paper_delay/mechanism.py --folder replicate_chain_long --report mechanism_replicate.md

Every finished run (one with its summary) of the folder, whatever its seed (the verdict reads only
its study's first seeds; this table is no verdict), from its step records (`<run>.jsonl`, what the
learner logs each step) at versions from the burn-in B on, where the primary metric starts counting
(protocol.burn_in; under a pinned lag L the steps up to L train on younger rollouts than the
regime's). Per run, the steps' mean of each share and weight, and the steps' median of k3 and the
gradient norm (heavy-tailed: a few steps' k3 runs to hundreds); per cell, the mean and SD of those
over its seeds.

- **clipped**: the share of the loss's units where its clip or bound acted (`clip_frac`): tokens
  for a token-level loss (GRPO, M2PO, TIS), sequences for a sequence-level one (GEPO, GSPO). For
  GRPO, GEPO (`gepo-lenclip` included) and GSPO those units' gradient is removed; for TIS,
  `gepo-decoupled` and the `*-trunc` variants it is capped and kept. `grpo_seqmask`'s dropped
  sequences are its `masked_frac`, not this.
- **drifted tokens**: tokens with |log p/q| > log 1.2, p the learner's policy and q the one that
  sampled them (node/algorithms/base.drift_stats): the same quantity for every loss.
- **k3**: per sequence the mean over its tokens of k3 = e^d - d - 1, d = log q/p, then the mean
  over sequences; a divergence score, not a KL.
- **p/q, A > 0 / A < 0**: the mean token weight on rows of positive and of negative advantage (a
  step without such rows logs 1.0, which pulls the mean towards 1).
- **grad norm**: before clipping (the learner's `grad_norm`).
- **train reward**: the mean reward of the rollouts each step trained on (under a lag, sampled L
  versions earlier).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.paper_delay.protocol import sd  # noqa: E402
from examples.paper_delay.reread import RESULTS, regime_name, start_of, write  # noqa: E402
from examples.paper_delay.run import cell_name, load, loss_and_options, own_route  # noqa: E402

FOLDER = "confirm_bf16_t600"
"""The confirmation's runs (confirm.CONFIRMATION), the default folder."""
SEQUENCE_LEVEL = ("gepo", "gspo")
"""Losses whose clip acts on a sequence's weight, so `clip_frac` is a share of sequences."""


@dataclass(frozen=True)
class Column:
    head: str
    key: str
    """The step record's key (or, where the record has none, its own-model route's: run.own_route)."""
    median: bool = False
    """Median over a run's steps, not the mean (a heavy-tailed figure)."""
    scale: float = 1.0
    fmt: str = ".3f"


COLUMNS = (
    Column("clipped %", "clip_frac", scale=100, fmt=".2f"),
    Column("drifted tokens %", "drift_frac", scale=100, fmt=".2f"),
    Column("k3 (median)", "kl_k3", median=True, fmt=".2e"),
    Column("p/q, A > 0", "weight_mean_pos", fmt=".4f"),
    Column("p/q, A < 0", "weight_mean_neg", fmt=".4f"),
    Column("grad norm (median)", "grad_norm", median=True),
    Column("train reward %", "reward", scale=100, fmt=".1f"),
)


def run_figures(records: list[dict], start: int) -> dict[str, float]:
    """One run's figure per column over its step records at versions >= `start` (its burn-in)."""
    out = {}
    for c in COLUMNS:
        xs = [x for r in records if r.get("kind") == "step" and r["version"] >= start
              and (x := own_route(r, c.key)) is not None and x == x]
        out[c.key] = (statistics.median(xs) if c.median else statistics.fmean(xs)) if xs else float("nan")
    return out


@dataclass(frozen=True)
class Cell:
    loss: str
    delay: int
    lag: bool
    """A pinned lag of `delay` versions; otherwise `delay` is the log-normal delay's maximum."""
    runs: dict[int, dict[str, float]]
    """seed -> the run's figures."""

    @property
    def regime(self) -> str:
        return regime_name(self.delay, self.lag)


def read_folder(folder: Path) -> list[Cell]:
    """Every cell of `folder` with the figures of each of its finished runs."""
    cells = []
    for (loss, delay), runs in load(folder).items():
        figures = {}
        for seed, summary in runs.items():
            log = folder / f"{cell_name(loss, delay, seed)}.jsonl"
            records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            figures[seed] = run_figures(records, start_of(summary))
        lag = any(s.get("settings", {}).get("lag") for s in runs.values())
        cells.append(Cell(loss, delay, lag, figures))
    return cells


def unit(loss: str) -> str:
    """What a loss's `clip_frac` is a share of."""
    return "sequences" if loss_and_options(loss)[0] in SEQUENCE_LEVEL else "tokens"


def _cell(values: list[float], c: Column) -> str:
    xs = [x * c.scale for x in values if x == x]
    if not xs:
        return "-"
    mean = statistics.fmean(xs)
    return f"{mean:{c.fmt}}" if len(xs) < 2 else f"{mean:{c.fmt}} ± {sd(xs):{c.fmt}}"


def table(cells: list[Cell]) -> str:
    """One row per cell (by delay, then loss): seed mean ± SD of each column."""
    head = "| regime | loss | seeds | clipped unit | " + " | ".join(c.head for c in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (4 + len(COLUMNS))]
    for cell in sorted(cells, key=lambda c: (c.delay, c.loss)):
        values = " | ".join(_cell([r[c.key] for r in cell.runs.values()], c) for c in COLUMNS)
        lines.append(f"| {cell.regime} | {cell.loss} | {len(cell.runs)} | {unit(cell.loss)} | {values} |")
    return "\n".join(lines)


def report(folder: str, name: str = "mechanism.md") -> str:
    command = "python examples/paper_delay/mechanism.py" + (
        "" if (folder, name) == (FOLDER, "mechanism.md") else f" --folder {folder} --report {name}")
    return (f"# The mechanism's diagnostics: docs/results/{folder}\n\n"
            f"Written by `{command}` (its docstring defines each column). Per run over its steps from the "
            f"burn-in on; per cell, mean ± SD over its seeds. Descriptive: no test, no correction.\n\n"
            f"{table(read_folder(RESULTS / folder))}\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--folder", default=FOLDER, help="a grid's folder under docs/results")
    p.add_argument("--report", default="mechanism.md", help="its file under docs/results/protocol")
    args = p.parse_args()
    write(args.report, report(args.folder, args.report))


if __name__ == "__main__":
    main()
