"""Issue 61's confirmation and its replication (docs/RESULTS.md, Protocol, "The cut", 2 and 4): the
verdict on the screen's pick, then the same on a second model and task.

    python examples/paper_delay/confirm.py    # writes docs/results/protocol/confirm.md, replicate*.md, shipped_t1.md

and each study's mechanism.py table of its runs' diagnostics (mechanism.md, mechanism_replicate*.md).

What each reads, each as soon as the runs it needs are in (a part of the grid is enough for the first):

1. **Run length.** The late gain (protocol.late_gain) of GRPO's online cell's seed-mean curve over
   the study's first five seeds at T = 300: 3 points or more, and T doubles before any other cell runs.
   A replication also has a gate, assay sensitivity: that cell's seed-mean primary metric must lie
   `sensitivity` (6 points) above the step-0 accuracy, or no other cell of the setting is read.
2. **Seeds.** Once every cell has the study's first `sd_after` seeds, the primary metric's SD pooled
   within the six cells over those seeds: the seeds a cell needs at 3 points at that SD (the
   confirmation: non-inferiority; the replication: superiority at Holm's first level), never fewer
   than the study declared.
3. **The verdict**, once every cell has the study's first that many seeds (a seed past them is not
   read): the pick minus GRPO per regime (Welch, 95%); Holm over the two superiority tests (lag 32,
   lag 128) at familywise 0.05; the pick wins if one holds and it is non-inferior (3 points,
   one-sided 2.5%) in each of the other regimes.

The replication runs only once the confirmation names the pick the winner.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.paper_delay import mechanism  # noqa: E402
from examples.paper_delay.protocol import Curve, holm, late_gain, non_inferior, pooled_sd, seeds_per_cell, welch  # noqa: E402
from examples.paper_delay.reread import ALPHA, MARGIN, POWER, REF, RESULTS, metrics, regime_name, write  # noqa: E402
from examples.paper_delay.run import fmt, load  # noqa: E402

PICK = "gepo-lenclip"
"""The screen's pick (docs/results/protocol/screen.md)."""
LAGS = (0, 32, 128)
FAMILY = (32, 128)
"""The regimes whose superiority tests form the family (Holm)."""


@dataclass(frozen=True)
class Study:
    """One verdict on the pick: where its runs are, which seeds, and its rules' counts."""

    title: str
    report: str
    """Its file under docs/results/protocol."""
    folder: str
    """The 300-step runs, GRPO's online cell first (it decides the run length)."""
    doubled: str
    """Its runs if the run length doubles (a folder of their own: run.py skips a cell whose summary
    exists, and a 300-step run is not a 600-step one)."""
    first_seed: int
    declared: int
    """Seeds a cell has at least: first_seed on, consecutive (the SD rule may raise it, never lower it)."""
    sd_after: int
    """Seeds a cell has when the SD rule is applied (its first `sd_after`, in every cell)."""
    sd_alpha: float
    """The two-sided level the SD rule sizes a cell for at 3 points and power 0.8: ALPHA is
    non-inferiority's one-sided 2.5%, ALPHA / 2 superiority at Holm's first level."""
    sensitivity: float | None = None
    """Assay sensitivity: how far GRPO's online seed-mean primary metric over `first` must lie above
    the step-0 accuracy for any other cell to be read (None: not declared, the confirmation)."""

    def seeds(self, n: int) -> tuple[int, ...]:
        """The study's first `n` seeds."""
        return tuple(range(self.first_seed, self.first_seed + n))

    @property
    def first(self) -> tuple[int, ...]:
        """GRPO's online seeds that decide the run length."""
        return self.seeds(5)


CONFIRMATION = Study("Issue 61's confirmation", "confirm.md", "confirm_bf16", "confirm_bf16_t600",
                     first_seed=100, declared=13, sd_after=10, sd_alpha=ALPHA)
"""builtin:tiny-chain on the chain task (docs/RESULTS.md, Protocol, "The cut", 2)."""
REPLICATION = Study("Issue 61's replication: a second model and task", "replicate.md", "replicate_chain_long",
                    "replicate_chain_long_t600", first_seed=200, declared=7, sd_after=5, sd_alpha=ALPHA / 2,
                    sensitivity=2 * MARGIN)
"""builtin:tiny-chain-long on the chain-long task (docs/RESULTS.md, Protocol, "The cut", 4): stopped,
2026-12-02, for want of assay sensitivity (the gate, declared then, is applied to it to show why)."""
REPLICATION_ARITH = Study("Issue 61's replication on the shipped model and the arith task", "replicate_arith.md",
                          "replicate_arith", "replicate_arith_t600", first_seed=300, declared=7, sd_after=5,
                          sd_alpha=ALPHA / 2, sensitivity=2 * MARGIN)
"""builtin:tiny-arith on the arith task, declared 2026-12-02 in its place (RESULTS, "The cut", 4)."""
SHIPPED_T1 = Study("Issue 61's shipped sampling under the lag (T 1.0, no top-p or top-k)", "shipped_t1.md",
                   "shipped_t1_arith", "shipped_t1_arith_t600", first_seed=400, declared=7, sd_after=5,
                   sd_alpha=ALPHA / 2, sensitivity=2 * MARGIN)
"""builtin:tiny-arith on arith at the swarm's sampling (RESULTS, "The cut", 5): the default stays only if
it is non-inferior in every regime."""
AFTER_CONFIRMATION = ((REPLICATION, "mechanism_replicate.md"), (REPLICATION_ARITH, "mechanism_replicate_arith.md"),
                      (SHIPPED_T1, "mechanism_shipped_t1.md"))
"""The studies that run once the confirmation names the pick the winner, with their mechanism tables."""


def seed_mean(runs: dict[int, dict], seeds) -> Curve:
    """The mean eval curve over `seeds` at the steps every one of them evaluated."""
    curves = [dict(map(tuple, runs[s]["evals"])) for s in seeds]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return [(step, statistics.fmean(c[step] for c in curves)) for step in steps]


def decided_t(cells: dict, study: Study) -> int | None:
    """The run length GRPO's first online seeds of the 300-step runs decide (None until all are in)."""
    runs = cells.get((REF, 0), {})
    if any(s not in runs for s in study.first):
        return None
    curve = seed_mean(runs, study.first)
    return 2 * curve[-1][0] if late_gain(curve) >= MARGIN else curve[-1][0]


def run_length(cells: dict, study: Study) -> str:
    runs, first = cells.get((REF, 0), {}), study.first
    if any(s not in runs for s in first):
        return f"Run length: {len(set(first) & set(runs))} of GRPO's online seeds {first[0]}-{first[-1]} are in."
    curve = seed_mean(runs, first)
    gain = late_gain(curve)
    steps = curve[-1][0]
    decision = (f"T doubles to {2 * steps} before any other cell runs" if gain >= MARGIN
                else f"T = {steps} stands")
    points = ", ".join(f"{s}: {100 * a:.1f}" for s, a in curve)
    return (f"Run length: GRPO online, seeds {first[0]}-{first[-1]}, seed-mean eval accuracy by step ({points}); late gain over "
            f"the last third {100 * gain:+.1f} points against the {100 * MARGIN:.0f}-point rule: **{decision}**.")


def sensitive(cells: dict, study: Study) -> tuple[str, bool | None]:
    """(what the assay-sensitivity gate reads, whether it holds: None until GRPO's first online seeds
    are in, True where the study declares none)."""
    if study.sensitivity is None:
        return "", True
    runs = cells.get((REF, 0), {})
    if any(s not in runs for s in study.first):
        return "", None
    gains = [metrics(runs[s])[0] - runs[s]["start"] for s in study.first]
    gain = statistics.fmean(gains)
    holds = gain >= study.sensitivity
    return (f"Assay sensitivity: GRPO online, seeds {study.first[0]}-{study.first[-1]}, primary metric minus the "
            f"step-0 accuracy ({100 * runs[study.first[0]]['start']:.1f}%): "
            f"{', '.join(f'{100 * g:+.1f}' for g in gains)}, mean {100 * gain:+.1f} points against the declared "
            f"{100 * study.sensitivity:.0f}: **" + ("holds**." if holds else
                                                   "fails**: no other cell of this setting is read.")), holds


def primaries(cells: dict, loss: str, lag: int, seeds: tuple[int, ...]) -> dict[int, float]:
    """Seed -> primary metric of a cell's runs among `seeds`."""
    runs = cells.get((loss, lag), {})
    return {seed: metrics(runs[seed])[0] for seed in seeds if seed in runs}


def seeds_in(cells: dict, loss: str, lag: int, study: Study) -> int:
    """How many of the study's seeds (its first on) a cell has run."""
    return sum(seed >= study.first_seed for seed in cells.get((loss, lag), {}))


def seeds_needed(cells: dict, study: Study) -> tuple[int | None, float | None]:
    """(seeds a cell needs, the pooled SD) once every cell has the study's first `sd_after` seeds;
    (None, None) before."""
    groups = [primaries(cells, loss, lag, study.seeds(study.sd_after)) for loss in (REF, PICK) for lag in LAGS]
    if any(len(g) < study.sd_after for g in groups):
        return None, None
    s = pooled_sd([list(g.values()) for g in groups])
    return max(study.declared, seeds_per_cell(s, MARGIN, study.sd_alpha, POWER)), s


def verdict(cells: dict, need: int, study: Study) -> tuple[list[str], bool | None]:
    """(the table and the sentence, whether the pick wins) on the study's first `need` seeds once every
    cell has them; (a line saying what is missing, None) before."""
    seeds, diffs = study.seeds(need), {}
    for lag in LAGS:
        a, b = primaries(cells, PICK, lag, seeds), primaries(cells, REF, lag, seeds)
        if len(a) < need or len(b) < need:
            return [f"Verdict: not yet ({len(a)} and {len(b)} of seeds {seeds[0]}-{seeds[-1]} at lag {lag})."], None
        diffs[lag] = welch(list(a.values()), list(b.values()))
    adjusted = dict(zip(FAMILY, holm([diffs[lag].p for lag in FAMILY])))
    superior = [lag for lag in FAMILY if adjusted[lag] <= ALPHA and diffs[lag].mean > 0]
    lines = ["| regime | GRPO, % (95%) | pick, % (95%) | pick - GRPO, points (95%) | p | Holm p | non-inferior at 3 |",
             "|---|---|---|---|---|---|---|"]
    for lag in LAGS:
        d = diffs[lag]
        holm_p = f"{adjusted[lag]:.2g}" if lag in adjusted else ""
        means = [fmt(list(primaries(cells, loss, lag, seeds).values())) for loss in (REF, PICK)]
        lines.append(f"| {regime_name(lag)} | {' | '.join(means)} | {100 * d.mean:+.1f} ± "
                     f"{100 * d.half:.1f} | {d.p:.2g} | {holm_p} | {'yes' if non_inferior(d, MARGIN) else 'no'} |")
    others_ok = all(non_inferior(diffs[lag], MARGIN) for lag in LAGS if lag not in superior)
    wins = bool(superior) and others_ok
    said = (f"**{PICK} wins**: superior at lag {' and '.join(map(str, superior))}, non-inferior elsewhere" if wins else
            f"**{PICK} does not win**: " + ("superior at no lag after Holm" if not superior
                                            else "superior, but not non-inferior in every other regime"))
    everywhere = all(non_inferior(diffs[lag], MARGIN) or lag in superior for lag in LAGS)
    said += f". Non-inferior (or superior) in every regime: **{'yes' if everywhere else 'no'}**."
    return ["\n".join(lines), said], wins


def runs_folder(study: Study, root: Path = RESULTS) -> tuple[dict, int | None, str]:
    """(the cells of the study's 300-step folder, the run length they decide, the folder of the
    study's runs at that length: the 300-step one until the length is decided)."""
    first = load(root / study.folder) if (root / study.folder).is_dir() else {}
    t = decided_t(first, study)
    return first, t, study.doubled if t is not None and t > 300 else study.folder


def report(study: Study, root: Path = RESULTS) -> tuple[str, bool | None]:
    """(the study's report, whether it names the pick the winner: None until its verdict)."""
    first, t, folder = runs_folder(study, root)
    cells = (load(root / folder) if (root / folder).is_dir() else {}) if t is not None else {}
    need, s = seeds_needed(cells, study)
    counts = ", ".join(f"{loss} {regime_name(lag)}: {seeds_in(cells, loss, lag, study)}"
                       for loss in (REF, PICK) for lag in LAGS)
    seeds = (f"Seeds: the SD rule waits for {study.sd_after} seeds a cell." if need is None else
             f"Seeds: pooled primary SD {100 * s:.1f} points over the six cells' first {study.sd_after} seeds: "
             f"{need} seeds a cell.")
    gate, holds = sensitive(first, study)
    said, won = verdict(cells, need or study.declared, study) if holds else (
        ["Verdict: none (the gate " + ("waits for GRPO's online seeds)." if holds is None else "failed).")], None)
    parts = [f"# {study.title}", "Written by `python examples/paper_delay/confirm.py` from "
             f"docs/results/{study.folder} and {study.doubled} (docs/RESULTS.md, Protocol, \"The cut\").",
             run_length(first, study), gate, f"The runs: docs/results/{folder}, T = {t}. Seeds in: {counts}."
             if t is not None else "The runs wait for the run length.", seeds, *said]
    return "\n\n".join(p for p in parts if p) + "\n", won


def main() -> None:
    text, won = report(CONFIRMATION)
    write(CONFIRMATION.report, text)
    for study, _ in AFTER_CONFIRMATION:
        text, _ = report(study)
        if won is None:
            text += "\nThe replication runs once the confirmation names the pick the winner; its verdict is not in yet.\n"
        elif not won:
            text += "\nThe confirmation did not name the pick the winner: the replication does not run.\n"
        write(study.report, text)
    for study, name in ((CONFIRMATION, "mechanism.md"), *AFTER_CONFIRMATION):
        _, t, folder = runs_folder(study)
        if t is not None and (RESULTS / folder).is_dir():  # the cells' diagnostics, descriptive (mechanism.py)
            write(name, mechanism.report(folder, name))


if __name__ == "__main__":
    main()
