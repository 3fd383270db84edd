"""Step time of each policy loss relative to GRPO, on the same batch.

    python examples/bench_losses.py [--reps 30]

Two measurements per loss, medians over `--reps` runs, printed side by side with the ratio to GRPO:
  * learner step: model forward (log-probs) + loss + backward on a real batch of rollouts from the
    built-in model (16 prompts x 8 completions), weights unchanged between runs;
  * loss only: loss + backward on synthetic [512 x 512] log-prob tensors (64 groups of 8), where a
    loss's own cost would show if it had any.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.algorithms import ALGORITHMS, LossInputs  # noqa: E402
from node.sampling.params import SamplingParams  # noqa: E402
from node.engines.hf import HFEngine  # noqa: E402
from node.training.logprobs import completion_logprobs  # noqa: E402
from node.models import BUILTIN_MODEL, load_model, load_tokenizer  # noqa: E402
from node.tasks import ArithmeticTask  # noqa: E402
from node.training.batch import ScoredGroup, build_batch  # noqa: E402


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def real_batch(seed: int = 0):
    torch.manual_seed(seed)
    tok, model = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL)
    task = ArithmeticTask()
    probs = random.Random(seed).sample(list(task.split("train")), 16)
    res = HFEngine(model, tok, BUILTIN_MODEL).generate([p.prompt for p in probs], SamplingParams(n=8, max_new_tokens=6))
    groups = [ScoredGroup(p.id, r.prompt_token_ids, r.completions, [task.reward(c.text, p.answer) for c in r.completions],
                          BUILTIN_MODEL, 0) for p, r in zip(probs, res)]
    return model, build_batch(groups, normalize_std=True, pad_id=tok.pad_token_id)


def learner_step_ms(model, batch, algo, reps: int) -> float:
    cfg = algo.make_config()

    def step():
        model.zero_grad(set_to_none=True)
        logp = completion_logprobs(model, batch.packed, 1.0)
        out = algo.loss(LossInputs(logp, batch.old_logp, batch.advantages, batch.packed.completion_mask, batch.group_ids), cfg)
        out.loss.backward()

    return timed(step, reps)


def loss_only_ms(algo, reps: int, B: int = 512, T: int = 512, G: int = 8) -> float:
    gen = torch.Generator().manual_seed(0)
    logp0 = -torch.rand(B, T, generator=gen) * 3
    old = logp0 + 0.1 * torch.randn(B, T, generator=gen)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None] < lengths[:, None]
    adv = torch.randn(B, generator=gen)
    gids = torch.arange(B // G).repeat_interleave(G)
    cfg = algo.make_config()

    def step():
        logp = logp0.clone().requires_grad_(True)
        algo.loss(LossInputs(logp, old, adv, mask, gids), cfg).loss.backward()

    return timed(step, reps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model, batch = real_batch()
    print(f"real batch: {batch.packed.input_ids.shape[0]} sequences x {batch.packed.input_ids.shape[1]} tokens; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    rows = {name: (learner_step_ms(model, batch, a, args.reps), loss_only_ms(a, args.reps)) for name, a in ALGORITHMS.items()}
    base_step, base_loss = rows["grpo"]
    print(f"{'loss':8} {'learner step ms':>16} {'vs GRPO':>8} {'loss-only ms':>13} {'vs GRPO':>8}")
    for name, (step_ms, loss_ms) in rows.items():
        print(f"{name:8} {step_ms:16.2f} {step_ms / base_step:8.2f} {loss_ms:13.2f} {loss_ms / base_loss:8.2f}")


if __name__ == "__main__":
    main()
