"""The existing stale-rollout cells (docs/results/*) re-read under issue 61's protocol (protocol.py).

    python examples/paper_delay/reread.py            # -> docs/results/protocol/reread.md (about 2 s)

Every loss of a regime against GRPO of the same regime (the same folder and settings; in the
emulated engine-error grids, GRPO on the samplers' claims): the primary metric's Welch difference
with its 95% interval, Holm over every such comparison found (the re-read's family), the
secondary metric's difference, the between-seed SDs of both metrics per cell, and the seeds per
cell issue 61's planned family needs at those SDs. A cell of one seed has no SD and no comparison.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.paper_delay.protocol import (Difference, burn_in, detectable, holm, non_inferior, pairing_ratio,
                                           pooled_sd, power_of, primary, sd, secondary, seeds_per_cell, welch)
from examples.paper_delay.run import load

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
REF = "grpo"
ALPHA, POWER = 0.05, 0.8
DELTA = MARGIN = 0.03
"""The difference the protocol is powered for, and its non-inferiority margin (RESULTS, Protocol)."""
PLANNED_FAMILY = 43
"""Issue 61's superiority tests (RESULTS, Protocol): 6 candidates x 8 delayed regimes, less the
shipped default's 5 float32 ones, where it was GRPO (the default until 2026-12-01) run for run ("auto" keeps float32 claims)."""
NON_INFERIORITY_REGIMES = 9
"""The other regimes a winner must be non-inferior in: 10 regimes less the one it wins in."""


@dataclass(frozen=True)
class Regime:
    table: str
    """The matrix (of MATRICES) it is a column of."""
    column: str
    delay: int
    folder: str = ""
    """Every loss of this folder at `delay`; or, with `sources`, nothing."""
    sources: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(label, folders under docs/results holding that label's GRPO cell): a later folder replaces a
    seed of an earlier one (a re-run)."""

    @property
    def name(self) -> str:
        return f"{self.table}: {self.column}"


A, LONG, EMULATED = "A", "B/C and lag", "emulated"
MATRICES = {
    A: "Grid A (section 1: 60 steps, T 1, log-normal reload delays up to max delay D, float32 samplers)",
    LONG: "300-step grids B/C (sections 2e-2f: T 1, log-normal) and the 150-step pinned-lag grids (section 6: "
          "T 0.6, top-p 0.95, top-k 20)",
    EMULATED: "The emulated engine error (section 6, issue 40; GRPO, 150 steps, T 0.6): other behaviour log-probs "
              "against the samplers' claims",
}
_CLAIMS, _LEARNER = "emulated_gap/claims", "grpo, learner's q"
REGIMES = (
    [Regime(A, f"D {d}", d, "delay") for d in (0, 8, 16, 32, 64, 256)]
    + [Regime(LONG, f"300 st., D {d}", d, "regime") for d in (0, 64, 256)]
    + [Regime(LONG, f"f32, lag {d}", d, "premise") for d in (0, 32)]
    + [Regime(LONG, f"bf16, lag {d}", d, "premise_bf16") for d in (0, 32)]
    + [Regime(LONG, "bf16 learner's q, lag 32", 32, "premise_bf16_recomputed"),
       Regime(EMULATED, "error 0.3, online", 0, sources=(
           (REF, (_CLAIMS,)), (_LEARNER, ("emulated_gap/learner",)),
           ("grpo, learner's q + cap 2", ("emulated_gap/tis_s03",)), ("grpo, auto@1e-3", ("emulated_gap/auto",)))),
       Regime(EMULATED, "error 0.3, lag 32", 32, sources=((REF, (_CLAIMS,)), (_LEARNER, ("emulated_gap/learner",)))),
       Regime(EMULATED, "error 0.2, online", 0, sources=(
           (REF, ("emulated_gap/claims_s02", "emulated_gap/claims_s02_rerun")),
           (_LEARNER, ("emulated_gap/learner_s02",)),
           ("grpo, learner's q + cap 2", ("emulated_gap/tis_s02",)), ("grpo, auto@1e-3", ("emulated_gap/auto_s02",)),
           ("grpo, auto@1e-8", ("emulated_gap/auto8_s02",)))),
       Regime(EMULATED, "float32, online", 0, sources=(
           (REF, ("emulated_gap/f32",)), ("grpo, auto@1e-8", ("emulated_gap/auto_f32",))))])


def cells_of(regime: Regime, root: Path = RESULTS) -> dict[str, dict[int, dict]]:
    """label -> {seed: summary} of one regime."""
    if not regime.sources:
        return {loss: runs for (loss, d), runs in load(root / regime.folder).items() if d == regime.delay}
    out: dict[str, dict[int, dict]] = {}
    for label, folders in regime.sources:
        for folder in folders:
            out.setdefault(label, {}).update(load(root / folder).get((REF, regime.delay), {}))
    return out


def regime_name(delay: int, lag: bool = True) -> str:
    """A cell's regime as the reports write it: online, a pinned lag, or a log-normal delay's maximum."""
    return "online" if delay == 0 else f"lag {delay}" if lag else f"max delay {delay}"


def start_of(summary: dict) -> int:
    """The burn-in of the run a summary describes: where its primary metric starts counting (older
    summaries have no `lag` setting: none ran one)."""
    steps = summary.get("settings", {}).get("steps", summary["steps"])
    return burn_in(steps, summary["delay"] if summary.get("settings", {}).get("lag") else 0)


def metrics(summary: dict) -> tuple[float, float]:
    """(primary, secondary) of one run's summary."""
    return primary(summary["evals"], start_of(summary)), secondary(summary["evals"])


@dataclass(frozen=True)
class Cell:
    regime: Regime
    label: str
    seeds: tuple[int, ...]
    primary: tuple[float, ...]
    secondary: tuple[float, ...]


def collect(regimes=REGIMES, root: Path = RESULTS) -> list[Cell]:
    cells = []
    for regime in regimes:
        for label, runs in sorted(cells_of(regime, root).items()):
            seeds = tuple(sorted(runs))
            m = [metrics(runs[s]) for s in seeds]
            cells.append(Cell(regime, label, seeds, tuple(x[0] for x in m), tuple(x[1] for x in m)))
    return cells


@dataclass(frozen=True)
class Row:
    """One comparison of the family: a loss's cell against GRPO's in the same regime."""
    cell: Cell
    ref: Cell
    primary: Difference
    secondary: Difference
    holm_p: float
    could_show: float
    """The smallest true difference found with POWER at Holm's strictest level, at these SDs and seeds."""

    @property
    def verdict(self) -> str:
        if self.holm_p <= ALPHA:
            return "better" if self.primary.mean > 0 else "worse"
        shown = "no difference shown"
        return shown if self.could_show <= DELTA else f"{shown}; underpowered: could not have shown {100 * DELTA:.0f} points"


def compare(cells: list[Cell]) -> list[Row]:
    """Every cell of 2+ seeds against GRPO's of its regime, Holm over all of them."""
    refs = {c.regime: c for c in cells if c.label == REF}
    pairs = [(c, refs[c.regime]) for c in cells
             if c.label != REF and c.regime in refs and len(c.seeds) >= 2 and len(refs[c.regime].seeds) >= 2]
    diffs = [welch(c.primary, r.primary) for c, r in pairs]
    rows = []
    for (c, r), d, adj in zip(pairs, diffs, holm([d.p for d in diffs])):
        se = math.sqrt(statistics.variance(c.primary) / len(c.seeds) + statistics.variance(r.primary) / len(r.seeds))
        rows.append(Row(c, r, d, welch(c.secondary, r.secondary), adj, detectable(se, d.df, ALPHA / len(pairs), POWER)))
    return rows


def _pm(d: Difference) -> str:
    return f"{100 * d.mean:+.1f} ± {100 * d.half:.1f}"


def long_table(rows: list[Row]) -> str:
    lines = ["| regime | loss | seeds | primary - GRPO (95%) | p | Holm p | verdict | could show | "
             f"non-inferior at {100 * MARGIN:.0f} | secondary - GRPO (95%) |", "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r.cell.regime.name} | {r.cell.label} | {len(r.cell.seeds)}/{len(r.ref.seeds)} | {_pm(r.primary)} | "
                     f"{r.primary.p:.2g} | {r.holm_p:.2g} | {r.verdict} | {100 * r.could_show:.1f} | "
                     f"{'yes' if non_inferior(r.primary, MARGIN) else 'no'} | {_pm(r.secondary)} |")
    return "\n".join(lines)


def matrix(rows: list[Row], table: str) -> str:
    """Loss x regime of one of MATRICES: primary - GRPO, bold where Holm rejects; a loss run in one
    regime only (a variant) is listed below the table."""
    columns = [g for g in REGIMES if g.table == table]
    here = [r for r in rows if r.cell.regime.table == table]
    labels = sorted({r.cell.label for r in here}, key=lambda x: (x.startswith("grpo"), x))
    by = {(r.cell.label, r.cell.regime): r for r in here}
    fmt = lambda r: f"**{_pm(r.primary)}**" if r.holm_p <= ALPHA else _pm(r.primary)  # noqa: E731
    lines = ["| loss | " + " | ".join(g.column for g in columns) + " |", "|---|" + "---|" * len(columns)]
    single = []
    for label in labels:
        ran = [g for g in columns if (label, g) in by]
        if len(ran) == 1 and table == A:
            single.append(f"{label} at {ran[0].column}: {fmt(by[(label, ran[0])])}")
            continue
        lines.append(f"| {label} | " + " | ".join(fmt(by[(label, g)]) if (label, g) in by else "" for g in columns) + " |")
    return "\n".join(lines) + ("\n\nRun in one regime only: " + "; ".join(single) + "." if single else "")


def planning_sds(cells: list[Cell]) -> dict[str, tuple[float, float]]:
    """name -> (primary SD, secondary SD) pooled over a set of cells; the first is the protocol's."""
    lag = [c for c in cells if c.regime.table == LONG and c.regime.folder.startswith("premise") and len(c.seeds) > 1]
    grpo = [c for c in cells if c.label == REF]
    long = [c for c in cells if c.regime.table != A and len(c.seeds) > 1]
    sets = {f"every cell of the 150-step pinned-lag grids ({len(lag)} cells): the protocol's": lag,
            f"every cell of the 150- and 300-step grids ({len(long)} cells)": long,
            f"GRPO's cells, every grid ({len(grpo)} cells)": grpo}
    return {name: (pooled_sd([c.primary for c in cs]), pooled_sd([c.secondary for c in cs])) for name, cs in sets.items()}


def power_tables(sds: dict[str, tuple[float, float]]) -> str:
    """Seeds per cell for 2, 3, 5 points at Holm's strictest level over the planned family, and for
    non-inferiority at the margin; then the declared SD against the family's size."""
    alpha = ALPHA / PLANNED_FAMILY
    lines = ["| SD pooled over | metric | SD (points) | 2 points | 3 points | 5 points | "
             f"non-inferiority at {100 * MARGIN:.0f} |", "|" + "---|" * 7]
    for name, pair in sds.items():
        for metric, s in zip(("primary", "secondary"), pair):
            need = [seeds_per_cell(s, d, alpha, POWER) for d in (0.02, 0.03, 0.05)]
            lines.append(f"| {name} | {metric} | {100 * s:.1f} | " + " | ".join(map(str, need))
                         + f" | {seeds_per_cell(s, MARGIN, ALPHA, POWER)} |")
    s = next(iter(sds.values()))[0]
    sizes = (1, 6, 12, 24, 43, 60)
    lines += ["", f"The protocol's SD ({100 * s:.1f} points, primary) against the family's size, 3 points, power {POWER}:",
              "", "| tests in the family | " + " | ".join(map(str, sizes)) + " |", "|---|" + "---|" * len(sizes),
              "| seeds per cell | " + " | ".join(str(seeds_per_cell(s, DELTA, ALPHA / m, POWER)) for m in sizes) + " |"]
    n = seeds_per_cell(s, DELTA, alpha, POWER)
    each = power_of(MARGIN, s * math.sqrt(2.0 / n), 2 * n - 2, 2 * 0.025)
    lines += ["", f"At {n} seeds a cell each non-inferiority test at {100 * MARGIN:.0f} points (true difference 0) has "
              f"power {each:.3f}, all {NON_INFERIORITY_REGIMES} of a winner's other regimes together "
              f"{each ** NON_INFERIORITY_REGIMES:.2f}."]
    return "\n".join(lines)


def pairing(rows: list[Row]) -> str:
    """var(diff) / (var a + var b) over the comparisons whose cells share 3+ seeds."""
    out = []
    for what in ("primary", "secondary"):
        pairs = []
        for r in rows:
            common = [s for s in r.cell.seeds if s in r.ref.seeds]
            if len(common) >= 3:
                pairs.append(([getattr(r.cell, what)[r.cell.seeds.index(s)] for s in common],
                              [getattr(r.ref, what)[r.ref.seeds.index(s)] for s in common]))
        out.append(f"{what} {pairing_ratio(pairs):.2f} over {len(pairs)} comparisons")
    return "var(a - b) / (var a + var b), seeds paired: " + ", ".join(out)


def sd_table(cells: list[Cell]) -> str:
    lines = ["| regime | loss | seeds | primary % | SD primary | SD secondary |", "|" + "---|" * 6]
    for c in cells:
        lines.append(f"| {c.regime.name} | {c.label} | {len(c.seeds)} | {100 * statistics.fmean(c.primary):.1f} | "
                     f"{100 * sd(c.primary):.1f} | {100 * sd(c.secondary):.1f} |")
    return "\n".join(lines)


def report(cells: list[Cell]) -> str:
    rows = compare(cells)
    powered = [f"{r.cell.label} ({r.cell.regime.name})" for r in rows if r.holm_p > ALPHA and r.could_show <= DELTA]
    return "\n\n".join([
        "# Existing cells re-read under issue 61's protocol",
        "Written by `python examples/paper_delay/reread.py` from docs/results/*/*.summary.json (docs/RESULTS.md, "
        "Protocol). Points of accuracy. Primary: a run's mean eval accuracy at or after its burn-in; secondary: the "
        "mean of its last 3 evaluations. Differences: Welch, 95% interval. "
        f"Family: all {len(rows)} comparisons below, Holm at familywise {ALPHA} (bold in the matrices). "
        f"'could show': the true difference a Welch test at Holm's strictest level ({ALPHA}/{len(rows)}) finds with "
        f"power {POWER} at the two cells' measured SDs and seeds.",
        *[f"## {title}\n\n{matrix(rows, key)}" for key, title in MATRICES.items()],
        f"Not bold and still able to show {100 * DELTA:.0f} points: {', '.join(powered) or 'none'}. {pairing(rows)}.",
        f"## Seeds per cell for issue 61's family ({PLANNED_FAMILY} tests, alpha {ALPHA}/{PLANNED_FAMILY}, power "
        f"{POWER})\n\n{power_tables(planning_sds(cells))}",
        f"## Every comparison\n\n{long_table(rows)}",
        f"## Between-seed SD of each cell\n\n{sd_table(cells)}",
    ]) + "\n"


def write(name: str, text: str) -> None:
    """Keep `text` as docs/results/protocol/`name`, and print it."""
    out = RESULTS / "protocol"
    out.mkdir(exist_ok=True)
    (out / name).write_text(text)
    print(text)


def main() -> None:
    write("reread.md", report(collect()))


if __name__ == "__main__":
    main()
