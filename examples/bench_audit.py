"""Spot audits of checkable sampling: detection rate, false-positive rate and cost.

    python examples/bench_audit.py [--steps 200] [--chosen 500]

1. False positives: the simulator trains the built-in model as the demo does (GEPO, the demo's
   lr and batch) with honest HF samplers, two of them behind by 1-20 versions (log-normal weight delays), and the
   learner audits *every* own-model group (audit_rate 1) at the version it claims, rebuilt from
   its own keyframes and deltas. Every failure is a false positive.
2. Detection: groups whose completions were chosen, not sampled (tests/helpers/attacker.py's attack: the
   answer plus one extra digit, claimed log-prob -2/token), and a subtler chooser that samples
   honestly and swaps one completion of eight for a correct answer; each audited once.
3. Cost: audit seconds against the learner's optimizer-step seconds, with every group audited and
   in a second run at the default audit policy (first 4 groups of each sampler, then at most 10%
   until it has passed 32 audits and 3% after, each at most the rate the audit budget affords:
   node/audit/budget.py, `audit.budget` = 2% of the training time), and what that budget buys:
   the spot rate p it came to, and how many audited groups of each attack in 2 refuse a sampler
   (its statistics add up over them), so how many cheated groups a proven sampler gets away with
   on average at p.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.audit_parts import audits_to_refusal  # noqa: E402
from node.learner.config import AuditConfig  # noqa: E402

from cli.config import SimSamplerSpec, SimulatorConfig
from cli.simulate import Simulator
from node.audit.flips import FlipTest, flip_llr
from node.audit.margins import audit_group
from node.sampling.race import group_seeds
from node.sampling.params import SamplingConfig
from node.learner import LearnerConfig
from node.models import BUILTIN_MODEL, load_model, load_tokenizer
from swarm.delay import DelayConfig


def refused_alone(r, audit: AuditConfig) -> bool:
    """Whether a new key is refused at this group, its first audited one (node/audit/auditor.py):
    a token past the hard bound, or its flips (at the ceiling rate) or its tokens past the margin
    too many for either sequential test at once (each at half the alarm)."""
    at_once = FlipTest(audit.flip_rate, audit.alarm / 2).threshold  # the learner's: both tests' thresholds are equal
    return (not r.passed or flip_llr(r.flips, r.positions, audit.flip_rate, FlipTest.RATIO) >= at_once
            or flip_llr(r.exceedances, r.positions, audit.exceed_rate, FlipTest.RATIO) >= at_once)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--chosen", type=int, default=500, help="chosen groups audited per attack")
    ap.add_argument("--margin", type=float, default=AuditConfig.margin,
                    help="the audit's tolerance in logits (AuditConfig.margin; its hard bound stays AuditConfig.margin_hard)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sampling = SamplingConfig()
    cfg = SimulatorConfig(
        learner=LearnerConfig(audit=AuditConfig(rate=1.0, rate_established=1.0, budget=math.inf, margin=args.margin,
                                              margin_hard=max(args.margin, AuditConfig.margin_hard)), eval_every=0, eval_size=50),
        sampling=sampling, steps=args.steps,
        samplers=(SimSamplerSpec(count=1), SimSamplerSpec(name="stale", count=2,
                                                          weight_delay=DelayConfig(kind="lognormal", lower_s=30, upper_s=20 * 30))),
        seconds_per_step=30)
    sim = Simulator(cfg)
    sim.run()
    learner = sim.learner
    st = learner.auditor.stats
    print(f"1. honest HF samplers, {learner.version} versions, staleness up to ~20, every group audited:")
    print(f"   {st['failed']} failed of {st['audits']} audited groups ({st['positions']} tokens): "
          f"false-positive rate {st['failed'] / max(st['audits'], 1):.4%} (goal < 0.1%); "
          f"max claimed-vs-audit log-prob gap {st['logprob_gap_max']:.2e}/token")

    tok, model = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL)
    engine = sim.samplers[0][0]
    problems = list(sim.task.split("train"))
    rng = random.Random(0)
    params = sampling.params
    caught = {"answer plus a digit, all 8": 0, "one of 8 swapped for the answer": 0}
    results: dict[str, list] = {k: [] for k in caught}  # every audited group's result, per attack
    tried = {"answer plus a digit, all 8": args.chosen, "one of 8 swapped for the answer": 0}
    for i in range(args.chosen):
        p = problems[i % len(problems)]
        seeds = group_seeds(b"\0" * 16, p.id, "chooser", sampling.group_size)
        prompt_ids = tok(p.prompt, add_special_tokens=False)["input_ids"]
        chosen = []
        for _ in range(sampling.group_size):
            ids = tok(p.answer + str(rng.randrange(10)), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            chosen.append((ids, [-2.0] * len(ids)))
        r = audit_group(model, prompt_ids, chosen, seeds, params, tok.pad_token_id, learner.cfg.audit.margin,
                        learner.cfg.audit.margin_hard)
        caught["answer plus a digit, all 8"] += refused_alone(r, learner.cfg.audit)
        results["answer plus a digit, all 8"].append(r)
        honest = engine.engine.generate([p.prompt], params, [seeds])[0].completions
        comps = [(c.token_ids, c.logprobs) for c in honest]
        ids = tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        if comps[0][0] != ids:  # only a swap that changes something can be caught
            comps[0] = (ids, [-0.5] * len(ids))
            engine.engine.model.eval()
            r = audit_group(engine.engine.model, prompt_ids, comps, seeds, params, tok.pad_token_id,
                            learner.cfg.audit.margin, learner.cfg.audit.margin_hard)
            caught["one of 8 swapped for the answer"] += refused_alone(r, learner.cfg.audit)
            results["one of 8 swapped for the answer"].append(r)
            tried["one of 8 swapped for the answer"] += 1  # (a swap for what was sampled anyway changes nothing)
    print("2. detection per audited group:")
    for k, v in caught.items():
        print(f"   {k}: {v} of {tried[k]} = {v / max(tried[k], 1):.2%} (goal >= 99%)")

    per_audit = st["time_s"] / max(st["audits"], 1)
    every_share = st["time_s"] / learner.training.time_s
    # the default policy's learner starts as a learner process does, without the two runs above in
    # its heap: with them, a full garbage collection took 176 ms, and one falling inside a timed
    # audit is charged to the budget (the likely cause of one run's 3.38%, docs/BENCHMARKS.md)
    del sim, learner, engine, model
    gc.collect()
    default = Simulator(dataclasses.replace(cfg, learner=LearnerConfig(eval_every=0, eval_size=50)))
    default.run()
    d = default.learner
    budget = d.auditor.budget
    spent, trained = d.auditor.stats["time_s"], d.training.time_s
    print(f"3. cost: every group audited: {per_audit * 1e3:.1f} ms per audited group (one forward pass per claimed "
          f"version), {every_share:.0%} of optimizer-step time")
    print(f"   default policy, budget {d.cfg.audit.budget:.0%} of training time: {d.auditor.stats['audits']} of "
          f"{d.version * d.cfg.groups_per_step} groups audited ({d.auditor.stats['reference_positions']} positions with "
          f"the flip rate's reference pass) in {spent:.2f} s against {trained:.1f} s of optimizer steps = "
          f"{spent / trained:.2%} of learner compute (budget {d.cfg.audit.budget:.0%})")
    steps = [r for r in d.history if r.get("kind") == "step"]
    half, last = steps[len(steps) // 2], steps[-1]
    print(f"   in the run's second half (v{half['version']}-v{last['version']}): "
          f"{last['audit']['audits'] - half['audit']['audits']} audits, "
          f"{(last['audit']['time_s'] - half['audit']['time_s']) / (last['train_time_s'] - half['train_time_s']):.2%} "
          f"of learner compute")
    balance = [r["audit"]["budget_earned_s"] - r["audit"]["budget_spent_s"] for r in steps]
    low = min(range(len(steps)), key=balance.__getitem__)
    repaid = next((r for r, b in zip(steps[low:], balance[low:]) if b >= 0), None)
    print(f"   the start: new keys' first audits while nothing proven waits, run whatever they cost: the budget's "
          f"balance fell to {balance[low]:+.3f} s at v{steps[low]['version']} ({-balance[low] / d.cfg.audit.budget:.1f} s of "
          f"training at the share; this run trained {trained:.1f} s)")
    if repaid is None:
        print("   the balance was not back to 0 by the run's end (run more --steps)")
    else:
        audit_s, train_s = (last["audit"]["time_s"] - repaid["audit"]["time_s"], last["train_time_s"] - repaid["train_time_s"])
        print(f"   back to 0 at v{repaid['version']}; from there to v{last['version']}: "
              f"{last['audit']['audits'] - repaid['audit']['audits']} audits, {audit_s / max(train_s, 1e-9):.2%} of learner "
              f"compute (budget {d.cfg.audit.budget:.0%}: the share by construction, up to spot audits' luck)")
    p = budget.spot_rate()
    print(f"   the spot rate the budget affords: p = {p:.2%} of a proven sampler's groups (measured: "
          f"{budget.train_cost.value * 1e3:.2f} ms to train a group, {budget.audit_cost.value * 1e3:.2f} ms "
          f"to spot-audit one); a new key's first {d.cfg.audit.first} groups are all audited")
    rate = d.auditor.flip_rate.rate(d.cfg.audit.flip_rate) if d.cfg.audit.calibrate else d.cfg.audit.flip_rate
    for k in caught:
        # the audit's statistics add up over a sampler's audited groups: not one group's detection
        audits = audits_to_refusal(results[k], rate, d.cfg.audit.exceed_rate, d.cfg.audit.alarm, rng)
        if audits is None:
            print(f"   {k}: never refused within {len(results[k])} audited groups")
            continue
        print(f"   {k}: a sampler doing it in every group is refused after {audits:.2f} audited groups on average "
              f"(flip test at {rate:.2%}, exceedance test at {d.cfg.audit.exceed_rate:g}); a proven one after "
              f"~{audits / p:.0f} such groups at p (plus ~12 events a long record can bank: the tests' floor)")


if __name__ == "__main__":
    main()
