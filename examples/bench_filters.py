"""What the audit's filter slack costs: `race_margins` per position with top-k / top-p at slack 1,
the band (`admitted` near the k-th logit, or near the top-p edge) against the whole-row path, in
one run, beside the unfiltered race (docs/BENCHMARKS.md, "What the slack costs the auditor").

    python examples/bench_filters.py [--vocab 32768 151936] [--rows 128] [--device cuda]

Random logits (standard normal x3, the spread of a trained LM's), T 0.6, best of --repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.sampling import filter_edges, race as checkable  # noqa: E402
from node.sampling.race import KEY_WORDS, race_margins  # noqa: E402

SETTINGS = [  # (label, top_k, top_p, slack, whole rows)
    ("no filter", 0, 1.0, 0.0, False),
    ("top-k 20 + top-p 0.95, no slack", 20, 0.95, 0.0, False),
    ("top-k 20 + top-p 0.95, slack 1, whole rows", 20, 0.95, 1.0, True),
    ("top-k 20 + top-p 0.95, slack 1, band", 20, 0.95, 1.0, False),
    ("top-p 0.95, slack 1, whole rows", 0, 0.95, 1.0, True),
    ("top-p 0.95, slack 1, band", 0, 0.95, 1.0, False),
]


def timed(fn, repeats: int, device: torch.device) -> float:
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32_768, 151_936])
    ap.add_argument("--rows", type=int, default=128, help="positions raced at once")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    device = torch.device(args.device)
    print(f"race_margins per position, {args.rows} positions, T 0.6, best of {args.repeats}, {device}")
    g = torch.Generator().manual_seed(0)
    for vocab in args.vocab:
        logits = (torch.randn(args.rows, vocab, generator=g) * 3).to(device)
        keys = torch.randint(0, 2**31, (args.rows, KEY_WORDS), generator=g, dtype=torch.int64).to(device)
        tokens = logits.argmax(-1)
        print(f"\nvocabulary {vocab:,}")
        for label, top_k, top_p, slack, whole in SETTINGS:
            def run():
                return race_margins(logits, tokens, keys, 0.6, top_k, top_p, slack)

            run()  # warm-up
            # whole rows: `admitted` as it was before the bands, every row sorted
            with mock.patch.object(checkable, "admitted", filter_edges._admitted) if whole else contextlib.nullcontext():
                t = timed(run, args.repeats, device)
            print(f"  {label:45s} {t / args.rows * 1e3:8.2f} ms a position")


if __name__ == "__main__":
    main()
