"""The sampler's per-token picker alone: checkable sampling's race against plain multinomial sampling.

    python examples/bench_picker.py [--device cuda] [--batch 128] [--vocab 151936 1024] [--steps 64]

What each generated token costs beyond the model's forward pass, on the same float32 logits:
  race       the HF engine's logits processor (node/engines/hf.PickTokens): the seeded race,
             the behaviour log-prob it records and the one-token mask it returns, keys included;
  plain      what transformers does to sample at T = 1: softmax, then torch.multinomial.
Also the number of tensor operations each issues per token (torch's profiler), which is what a GPU
pays for when the tensors are small: each is a kernel launch. Figures are per generated token
(one row per sequence), median over `--steps` steps after a warm-up; the model's forward pass,
which both share, is not included: examples/bench_bf16_audit.py --cost times whole generation.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from node.sampling.race import group_seeds  # noqa: E402
from node.sampling.params import SamplingParams  # noqa: E402
from node.engines.hf import PickTokens  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def per_step(fn, steps: int, device: torch.device) -> float:
    """Median seconds of fn(t) over `steps` calls (t = 0, 1, ...), after 4 warm-up calls."""
    for t in range(4):
        fn(t)
    times = []
    for t in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        fn(t)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def op_count(fn) -> int:
    """Top-level torch operations one call issues."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(0)
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, nargs="+", default=[128], help="rows (sequences) per step")
    ap.add_argument("--vocab", type=int, nargs="+", default=[151_936, 1_024])
    ap.add_argument("--steps", type=int, default=32)
    args = ap.parse_args()
    device = torch.device(args.device)
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=10_000)
    print(f"device {device}{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}, "
          f"torch {torch.__version__}, threads {torch.get_num_threads()}; per generated token, median of {args.steps}")
    print(f"{'batch':>6}{'vocab':>9}{'race ms':>10}{'plain ms':>10}{'extra ms':>10}{'race ops':>10}{'plain ops':>10}")
    for batch in args.batch:
        seeds = [s for i in range(-(-batch // 8)) for s in group_seeds(bytes(16), f"p{i}", "bench", 8)][:batch]
        for vocab in args.vocab:
            g = torch.Generator(device=device).manual_seed(0)
            logits = torch.randn(batch, vocab, generator=g, device=device) * 3
            ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
            picker = PickTokens(params, prompt_len=1, seeds=seeds)

            def race(t: int) -> None:
                picker(ids.expand(batch, 1 + t), logits.clone())  # generate hands it a fresh tensor
                picker.steps.clear()

            def plain(t: int) -> None:
                torch.multinomial(torch.softmax(logits.clone() / params.temperature, dim=-1), 1)

            r, p = per_step(race, args.steps, device), per_step(plain, args.steps, device)
            print(f"{batch:>6}{vocab:>9}{r * 1e3:>10.3f}{p * 1e3:>10.3f}{(r - p) * 1e3:>+10.3f}"
                  f"{op_count(race):>10}{op_count(plain):>10}")


if __name__ == "__main__":
    main()
