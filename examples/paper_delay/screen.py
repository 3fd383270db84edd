"""Issue 61's screen (docs/RESULTS.md, Protocol, "The cut"): which candidate the confirmation runs.

    python examples/paper_delay/screen.py      # reads docs/results, writes docs/results/protocol/screen.md

Every candidate at bfloat16 samplers, pinned lag 32, the authors' sampling, 150 steps, seeds 0-4:
section 6's `premise_bf16` cells (GRPO, GEPO, `gepo-lenclip`) and the screen's own
(`screen_bf16`: `grpo_seqmask`, `gspo`, `tis`; `screen_bf16_default`: the shipped default then, GRPO
(until 2026-12-01) with `behaviour_logprobs = "auto"` and `rollout_is_cap = 2`). The pick, declared before the runs:
the candidate with the highest mean primary metric, once every candidate has all its seeds;
differences to GRPO are printed, never read as verdicts (a screen's winner carries its luck).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.paper_delay.protocol import welch  # noqa: E402
from examples.paper_delay.reread import RESULTS, metrics, write  # noqa: E402
from examples.paper_delay.run import load  # noqa: E402

LAG = 32
SEEDS = (0, 1, 2, 3, 4)
REFERENCE = ("grpo", "premise_bf16", "grpo")
CANDIDATES = (  # (name, folder under docs/results, the loss its summaries carry)
    ("grpo_seqmask", "screen_bf16", "grpo_seqmask"),
    ("gspo", "screen_bf16", "gspo"),
    ("tis", "screen_bf16", "tis"),
    ("gepo-lenclip", "premise_bf16", "gepo-lenclip"),
    ("gepo", "premise_bf16", "gepo"),
    ("shipped default", "screen_bf16_default", "grpo"),
)


def primaries(folder: str, loss: str, root: Path = RESULTS) -> dict[int, float]:
    """seed -> primary metric of one cell at the screen's lag (only the screen's seeds)."""
    runs = load(root / folder).get((loss, LAG), {}) if (root / folder).is_dir() else {}
    return {seed: metrics(s)[0] for seed, s in runs.items() if seed in SEEDS}


def pick(cells: dict[str, dict[int, float]], seeds=SEEDS) -> str | None:
    """The candidate with the highest mean primary metric; None while any lacks one of `seeds`."""
    if any(set(seeds) - set(got) for got in cells.values()):
        return None
    return max(cells, key=lambda name: statistics.fmean(cells[name].values()))


def report(root: Path = RESULTS) -> str:
    ref = primaries(*REFERENCE[1:], root=root)
    cells = {name: primaries(folder, loss, root) for name, folder, loss in CANDIDATES}
    lines = ["| candidate | seeds | primary % (mean ± SD) | minus GRPO (Welch 95%, descriptive) |", "|---|---|---|---|"]
    for name, got in [("grpo (reference)", ref), *cells.items()]:
        xs = [got[s] for s in sorted(got)]
        if not xs:
            lines.append(f"| {name} | 0 | | |")
            continue
        sd = f" ± {100 * statistics.stdev(xs):.1f}" if len(xs) > 1 else ""
        diff = ""
        if name != "grpo (reference)" and len(xs) > 1 and len(ref) > 1:
            d = welch(xs, list(ref.values()))
            diff = f"{100 * d.mean:+.1f} ± {100 * d.half:.1f}"
        lines.append(f"| {name} | {len(xs)} | {100 * statistics.fmean(xs):.1f}{sd} | {diff} |")
    chosen = pick(cells)
    missing = sum(len(set(SEEDS) - set(got)) for got in cells.values())
    lines += ["", f"**Pick: {chosen}**" if chosen else f"No pick yet: {missing} runs of the screen still to run."]
    return "\n".join(lines) + "\n"


def main() -> None:
    write("screen.md", report())


if __name__ == "__main__":
    main()
