"""What honest answers cost math-verify, and what a group costs through the learner's bounded path
(node/tasks/bounded.py): the figures behind its budget.

    python examples/bench_reward_budget.py [GROUPS]      (default 625 groups of 8: 5,000 answers)

Prints one completion's p50 / p99 / p99.9 / max scored in this process (the main thread, with
math-verify's own timeouts: how a learner scored before the worker), a group's sum of them, and
the same groups through the worker (each group's wall time as the learner's thread sees it), and
the time a pathological group takes to be dropped.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the answers the tests use too
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.honest_answers import honest_groups  # noqa: E402
from node.tasks.bounded import OverBudget, RewardWorker, group_budget_s  # noqa: E402
from node.tasks.rewards import math_verify_reward  # noqa: E402


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def line(name: str, xs: list[float]) -> str:
    return (f"{name}: n={len(xs)} mean {statistics.mean(xs) * 1e3:.1f} ms, p50 {q(xs, .5) * 1e3:.1f}, "
            f"p99 {q(xs, .99) * 1e3:.1f}, p99.9 {q(xs, .999) * 1e3:.1f}, max {max(xs) * 1e3:.1f} ms")


def main(n: int) -> None:
    groups = honest_groups(n)
    math_verify_reward("\\boxed{1}", "1")  # imports
    one, group_sums, wrong = [], [], 0
    for kind, gold, comps in groups:
        total = 0.0
        for text, right in comps:
            t = time.perf_counter()
            r = math_verify_reward(text, gold)
            dt = time.perf_counter() - t
            one.append(dt)
            total += dt
            wrong += r != float(right)
        group_sums.append(total)
    print(line("one completion, in-process", one))
    print(line("a group of 8, in-process", group_sums))
    print(f"rewards that differ from the answer's intended rightness: {wrong} of {len(one)}")
    worker = RewardWorker("math_verify")
    worker.rewards(["\\boxed{1}"], "1")  # started
    via, over = [], 0
    for kind, gold, comps in groups:
        t = time.perf_counter()
        try:
            worker.rewards([c for c, _ in comps], gold)
        except OverBudget:
            over += 1
        via.append(time.perf_counter() - t)
    print(line("a group of 8, through the worker", via))
    print(f"budget of a group of 8: {group_budget_s(8):.2f} s; honest groups over it: {over}; "
          f"worker / in-process, summed: {sum(via) / sum(group_sums):.3f}")
    for name, text in [("9^{9^{9}} (pre-check)", "\\boxed{9^{9^{9}}}"), ("(x+1)^{1000} (deadline)", "\\boxed{(x+1)^{1000}}")]:
        t = time.perf_counter()
        try:
            worker.rewards([text] * 8, "5")
            print(f"{name}: scored?!")
        except OverBudget as e:
            print(f"a group of 8 x {name}: dropped after {time.perf_counter() - t:.3f} s ({e})")
    worker.close()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 625)
