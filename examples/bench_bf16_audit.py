"""The audit across precisions: honest float32 / bfloat16 / float16 samplers against the learner's
float32 audit by margin, what a tolerance lets an attacker do, and what the race costs.

    python examples/bench_bf16_audit.py                                   # CPU: small sizes
    python examples/bench_bf16_audit.py --device cuda --preset gpu        # every GPU figure of issue 40
    .venv-vllm/bin/python examples/bench_bf16_audit.py --models builtin --vllm      # and vLLM's kernels

A volunteer's GPU samples in bfloat16 or float16 with its own kernels and batch sizes; the learner
audits in float32 (node/audit/margins.py): at every position, how far (in logits) the claimed token's race
score is below the best (node/sampling/race.race_margins). Per sampler setting this prints:
  - flips: the share of tokens whose margin exceeds node/audit.FLIP_MARGIN (the sampler's token is
    not the float32 race's choice), with its 95% interval, and the margins' p99, p99.9 and max;
  - exceedances: the share of tokens past the tolerance (`--margin`, default AuditConfig.margin)
    and within the hard bound (`--margin-hard`), with its 95% interval, beside the exceedance
    test's honest ceiling (`--exceed-rate`); honest groups failed (a token past the hard bound),
    with the 95% interval; and the chance that the flip test (node/audit.FlipTest at the learner's
    audit_flip_rate) or the exceedance test ever refuses such a sampler within 10,000 audited
    groups, by resampling the measured groups (Monte Carlo);
  - the training side: the behaviour log-probs the sampler reports against the float32 learner's,
    k3 = E[r - 1 - log r] per token (r = p_learner / p_sampler) and the share of tokens with
    |r - 1| > 0.2 (GRPO's clip), so on-policy p/q is not 1;
  - detection per audited group: (a) one completion swapped for the right answer (built-in model),
    (b) one token edited to the most likely other, and (c) an attacker that samples in float32 and,
    wherever the token that leads to the right answer is within the hard bound, takes it: its
    accuracy against honest sampling, its groups failed, and how many of its groups the audit's
    two sequential tests need to refuse it.
  - the race's cost (`--cost`): generation time with the engine's sampler (race + behaviour
    log-probs) against transformers' own multinomial sampling, same model and batch.

Models (never downloaded):
  builtin  the built-in arithmetic model (trained; the demo's prompts, completions of <= 6 tokens)
  mid      a Qwen3 shape from a config (8 layers, hidden 512, vocabulary 32,768), random weights
  big      the Qwen3-0.6B shape with its 151,936-token vocabulary (untied head; `--big-layers` of
           its 28 layers), random weights
Random-weight models have their output head scaled so that the next-token entropy is that of a
trained LM (about 2-3 nats); their prompts are random tokens, completions run to the length asked.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import logging
import math
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.audit_parts import DTYPES, Measured, audits_to_refusal, generate, measure, random_model  # noqa: E402
from node.audit.margins import FLIP_MARGIN, AuditItem, audit_margins, judge_margins
from node.audit.flips import FlipRate, FlipTest, flip_llr, wilson  # noqa: E402
from node.sampling.race import group_seeds, keys_tensor, pick_tokens, position_keys, race_margins  # noqa: E402
from node.sampling.params import SamplingParams  # noqa: E402
from node.engines.hf import PickTokens  # noqa: E402
from node.learner.config import AuditConfig  # noqa: E402
from node.training.logprobs import completion_logits, logprobs_from_logits, pack  # noqa: E402

WRITE = None
"""Writes the tables so far (set by main when --out is given)."""


def share(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k}/{n} = {k / max(n, 1):.2%} [{lo:.2%}, {hi:.2%}]"


# ---- the attacker (c) -----------------------------------------------------------------------------

class AnswerSeeker(PickTokens):
    """The attacker (c): draws in float32 like an honest sampler, but wherever the next token of
    its row's target (the right answer, then EOS) is within `tol` of the race's best on its own
    logits, it takes that token instead."""

    def __init__(self, params, prompt_len, seeds, targets: list[list[int]], tol: float, slack: float) -> None:
        super().__init__(params, prompt_len, seeds)
        self.targets, self.tol, self.slack = targets, tol, slack

    def __call__(self, input_ids, scores):
        p, t = self.params, input_ids.shape[1] - self.prompt_len
        keys = keys_tensor([position_keys(s, 1, t)[0] for s in self.seeds], scores.device)
        honest = pick_tokens(scores, keys, p.temperature, p.top_k, p.top_p)
        target = torch.tensor([tg[t] if t < len(tg) else -1 for tg in self.targets], device=scores.device)
        ok = target >= 0
        margin = race_margins(scores, target.clamp(min=0), keys, p.temperature, p.top_k, p.top_p, self.slack)
        # on track: every earlier token was the target's (else the answer is lost anyway)
        track = torch.tensor([list(input_ids[r, self.prompt_len:].tolist()) == tg[:t]
                              for r, tg in enumerate(self.targets)], device=scores.device)
        chosen = torch.where(ok & track & (margin <= 0.9 * self.tol), target.clamp(min=0), honest)
        self.steps.append(logprobs_from_logits(scores, chosen, p.logprob_temperature))
        return torch.full_like(scores, -torch.inf).scatter_(-1, chosen[:, None], 0.0)


def alarm_chance(flips: list[int], positions: list[int], rate: float, alarm: float, groups: int = 10_000,
                 runs: int = 1000, seed: int = 0) -> float:
    """The share of `runs` simulated samplers, each `groups` audited groups drawn (with replacement)
    from the measured ones, that the sequential test of their events (`flips`: flips, or
    exceedances) at `rate` refuses: an honest sampler's chance of refusal."""
    g = torch.Generator().manual_seed(seed)
    llr = torch.tensor([flip_llr(f, n, rate, FlipTest.RATIO) for f, n in zip(flips, positions)], dtype=torch.float64)
    test = FlipTest(rate, alarm)  # its threshold and floor
    refused = 0
    for start in range(0, runs, 100):
        n = min(100, runs - start)
        draws = llr[torch.randint(0, len(llr), (n, groups), generator=g)]
        total, top = torch.zeros(n, dtype=torch.float64), torch.full((n,), -math.inf, dtype=torch.float64)
        for step in draws.T:  # the sum with FlipTest's floor, as the learner keeps it
            total = (total + step).clamp(min=test.floor)
            top = torch.maximum(top, total)
        refused += int((top >= test.threshold).sum())
    return refused / runs


TOLERANCES = (0.25, 0.5, 1.0, 2.0)
"""Honest groups failed is also printed at these margins (logits), to choose the default from."""


def exceeding(x: torch.Tensor, tol: float, hard: float) -> int:
    """A group's exceedances: margins past `tol`, within `hard` (node/audit/margins.judge_margins)."""
    return int(((x > tol) & (x <= hard)).sum())


def report(name: str, label: str, m: Measured, tol: float, rate: float, alarm: float, elapsed: float,
           table: list[dict], hard: float, exceed_rate: float) -> None:
    margins = torch.cat(m.margins)
    flips = [int((x > FLIP_MARGIN).sum()) for x in m.margins]
    exceed = [exceeding(x, tol, hard) for x in m.margins]
    positions = [len(x) for x in m.margins]
    failed = sum(int((x > hard).any()) for x in m.margins)
    q = lambda p: float(margins.quantile(p)) if len(margins) < 16_000_000 else float(margins.sort().values[int(p * (len(margins) - 1))])  # noqa: E731
    r = (torch.cat(m.mine) - torch.cat(m.claimed)).double().exp()
    k3 = float((r - 1 - r.log()).mean())
    clip = float(((r - 1).abs() > 0.2).double().mean())
    chance = alarm_chance(flips, positions, rate, alarm / 2)  # the learner's: each test at half the alarm
    chance_x = alarm_chance(exceed, positions, exceed_rate, alarm / 2)
    lo, hi = wilson(failed, len(m.margins))
    x_hi = wilson(sum(exceed), len(margins))[1]
    row = dict(model=name, sampler=label, groups=len(m.margins), tokens=len(margins), flips=sum(flips),
               flip_share=sum(flips) / max(len(margins), 1), p99=q(0.99), p999=q(0.999), max=float(margins.max()),
               failed=failed, failed_hi=hi, alarm10k=chance, k3=k3, clip=clip, exceed=sum(exceed), exceed_hi=x_hi,
               exceed_alarm10k=chance_x,
               failed_at={t: sum(int((x > t).any()) for x in m.margins) for t in TOLERANCES},
               tokens_per_s=len(margins) / max(elapsed, 1e-9))
    table.append(row)
    print(f"\n{name}, sampler {label}: {len(m.margins)} groups, {len(margins)} tokens, sampled at "
          f"{row['tokens_per_s']:.0f} tokens/s")
    print(f"  flips (margin > {FLIP_MARGIN:g}): {share(sum(flips), len(margins))}; margin p99 {row['p99']:.3g}, "
          f"p99.9 {row['p999']:.3g}, max {row['max']:.3g} logits")
    print(f"  exceedances (margin in ({tol:g}, {hard:g}]): {share(sum(exceed), len(margins))}, against the test's "
          f"ceiling {exceed_rate:g}; it refuses such a sampler within 10,000 groups: {chance_x:.2%} of 1,000 resampled runs")
    print(f"  honest groups failed (a margin past {hard:g}): {share(failed, len(m.margins))}; flip test (rate {rate:g}, "
          f"alarm {alarm / 2:g}) refuses such a sampler within 10,000 groups: {chance:.2%} of 1,000 resampled runs")
    print("  honest groups with a margin past " + ", ".join(f"{t:g}: {v}" for t, v in row["failed_at"].items()))
    print(f"  training side: k3 {k3:.2e} per token, |p_learner/p_sampler - 1| > 0.2 on {clip:.3%} of tokens")
    if WRITE is not None:
        WRITE()


def attacks(name: str, model32, items: list[AuditItem], params, pad, args, rng: random.Random,
            answers: list[list[int]] | None, attack_rows: dict) -> None:
    """(a) swap for the answer, (b) one token edited to the most likely other: groups caught."""
    lines = []
    for how in (["answer", "likely"] if answers else ["likely"]):
        chosen = []
        for i, it in enumerate(items[:512]):  # one forward pass per edit: 512 groups suffice
            comps = list(it.completions)
            j = rng.randrange(params.n)
            if how == "answer":
                if comps[j][0] == answers[i]:
                    continue  # the sampler drew the answer anyway: a swap changes nothing
                comps[j] = (answers[i], [-0.5] * len(answers[i]))
            else:
                comps[j] = one_edit(model32, it.prompt_ids, comps[j], pad, rng)
            chosen.append(AuditItem(it.prompt_ids, comps, it.seeds))
        m = measure(model32, chosen, params, pad, per_pass=8, slack=args.slack, hard=args.margin_hard)
        caught = sum(int((x > args.margin_hard).any()) for x in m.margins)
        # a sampler that does this in every group: how many audited groups until it is refused
        # (a group past the hard bound, or either sequential test), over random orders of the groups
        after = audits_to_refusal([judge_margins(x, 0.0, args.margin, args.margin_hard) for x in m.margins],
                                  args.rate_now, args.exceed_rate, args.alarm, rng)
        attack_rows[(name, how)] = (caught, len(chosen), after)
        lines.append(f"    ({'a' if how == 'answer' else 'b'}) {'one of 8 swapped for the answer' if how == 'answer' else 'one token edited to the most likely other'}: "
                     f"{share(caught, len(chosen))}; done in every group, refused after {f'{after:.2f}' if after else 'more than ' + str(len(chosen))} audited groups on average")
    print(f"  detection per audited group (a margin past {args.margin_hard:g}):")
    print("\n".join(lines))
    if WRITE is not None:
        WRITE()


@torch.no_grad()
def one_edit(model, prompt: list[int], comp, pad: int, rng: random.Random):
    """`comp` with the token at one random position replaced by the most likely other token; the
    completion ends there (what follows would be re-drawn)."""
    toks, lps = list(comp[0]), list(comp[1])
    t = rng.randrange(len(toks))
    *_, (_, logits) = completion_logits(model, pack([prompt], [toks[: t + 1]], pad).to(next(model.parameters()).device))
    row = logits[-1].clone()
    row[toks[t]] = -torch.inf
    toks[t] = int(row.argmax())
    return toks[: t + 1], lps[: t + 1]


# ---- the runs ------------------------------------------------------------------------------------

def run_model(name: str, model32, prompts, params, pad, eos, dtypes, batches, args, rng, table, attack_rows,
              answers=None, task=None, problems=None) -> None:
    nonce = bytes(16)
    seeds = [group_seeds(nonce, f"p{i}", "sampler", params.n) for i in range(len(prompts))]
    # the first low precision at every batch size (kernels differ with the batch), the others at the
    # largest; a smaller batch samples a share of the groups in proportion (the same calls' count),
    # and batch 1 only up to 256 tokens
    top = max(batches)
    settings = [("float32", top)] + [(dtypes[0], b) for b in batches
                                     if b == top or params.max_new_tokens <= 256] + [(d, top) for d in dtypes[1:]]
    if args.vllm and answers is not None:  # vLLM's own kernels and batching (the built-in model)
        settings += [("vllm:" + d, top) for d in ("float32", *dtypes)]
    first_low = True
    for dtype, batch in settings:
        n_prompts = max(1, len(prompts) * batch // top)
        if dtype.startswith("vllm:"):
            groups, elapsed = vllm_generate(dtype.removeprefix("vllm:"), prompts[:n_prompts], params, seeds[:n_prompts])
            items = [AuditItem(prompts[i], groups[i], seeds[i]) for i in range(n_prompts)]
            m = measure(model32, items, params, pad, per_pass=args.per_pass, slack=args.slack, hard=args.margin_hard)
            report(name, f"vLLM {dtype.removeprefix('vllm:')}", m, args.margin, args.rate_now, args.alarm, elapsed, table,
                   args.margin_hard, args.exceed_rate)
            continue
        sampler = model32 if dtype == "float32" else copy.deepcopy(model32).to(DTYPES[dtype])
        groups, elapsed = generate(sampler, prompts[:n_prompts], params, seeds[:n_prompts], batch, eos, pad)
        items = [AuditItem(prompts[i], groups[i], seeds[i]) for i in range(n_prompts)]
        m = measure(model32, items, params, pad, per_pass=args.per_pass, slack=args.slack, hard=args.margin_hard)
        if dtype == "float32" and args.calibrate:  # the learner's own measure of an honest bfloat16 engine
            calib = FlipRate()
            for s in range(0, len(items), args.per_pass):
                for margins, _, ref, _ in audit_margins(model32, items[s : s + args.per_pass], params, pad, reference=True,
                                                     slack=args.slack):
                    calib.add(ref, len(margins))
            args.rate_now = calib.rate(args.flip_rate)
            print(f"  calibrated: the auditor's bfloat16 reference flips at {calib.flips}/{calib.positions} positions: "
                  f"flip test rate {args.rate_now:.3%} (ceiling {args.flip_rate:g})")
        report(name, f"HF {dtype} batch {batch}", m, args.margin, args.rate_now, args.alarm, elapsed, table,
               args.margin_hard, args.exceed_rate)
        if dtype != "float32" and first_low:
            first_low = False
            attacks(name, model32, items, params, pad, args, rng, answers, attack_rows)
            if answers is not None:
                seeker_attack(name, model32, prompts, params, pad, eos, seeds, answers, task, problems, args, attack_rows)
        del sampler


def vllm_generate(dtype: str, prompts: list[list[int]], params, seeds) -> tuple[list, float]:
    """The built-in model's completions from the vLLM engine (its venv: README, "vLLM") in `dtype`."""
    import gc

    from node.engines.vllm import VLLMConfig, VLLMEngine
    from node.models import BUILTIN_MODEL, load_tokenizer

    tok = load_tokenizer(BUILTIN_MODEL)
    engine = VLLMEngine(BUILTIN_MODEL, tok, VLLMConfig(dtype=dtype, max_model_len=256))
    t0 = time.perf_counter()
    res = engine.generate([tok.decode(p) for p in prompts], params, seeds=seeds)
    elapsed = time.perf_counter() - t0
    assert [r.prompt_token_ids for r in res] == prompts
    del engine
    gc.collect()
    return [[(c.token_ids, c.logprobs) for c in r.completions] for r in res], elapsed


def seeker_attack(name, model32, prompts, params, pad, eos, seeds, answers, task, problems, args, attack_rows) -> None:
    """(c): the answer seeker against honest float32 sampling of the same prompts and seeds."""
    from node.models import BUILTIN_MODEL, load_tokenizer

    tok = load_tokenizer(BUILTIN_MODEL)
    batch = 128

    def seeker(chunk, width):
        return AnswerSeeker(params, width, [seeds[i][j] for i, j in chunk], [answers[i] for i, _ in chunk],
                            args.margin_hard, args.slack)

    honest, _ = generate(model32, prompts, params, seeds, batch, eos, pad)
    cheat, _ = generate(model32, prompts, params, seeds, batch, eos, pad, picker=seeker)

    def accuracy(groups) -> float:
        rewards = [task.reward(tok.decode(toks, skip_special_tokens=True), problems[i].answer)
                   for i, g in enumerate(groups) for toks, _ in g]
        return sum(rewards) / len(rewards)

    items = [AuditItem(prompts[i], cheat[i], seeds[i]) for i in range(len(prompts))]
    m = measure(model32, items, params, pad, per_pass=args.per_pass, slack=args.slack, hard=args.margin_hard)
    failed = sum(int((x > args.margin_hard).any()) for x in m.margins)
    test, xtest, refused_after = FlipTest(args.rate_now, args.alarm / 2), FlipTest(args.exceed_rate, args.alarm / 2), None
    for n, x in enumerate(m.margins, 1):  # in the order made, as the learner would audit them
        if (x > args.margin_hard).any() | test.add("c", int((x > FLIP_MARGIN).sum()), len(x)) \
                | xtest.add("c", exceeding(x, args.margin, args.margin_hard), len(x)):
            refused_after = n
            break
    acc_h, acc_c = accuracy(honest), accuracy(cheat)
    attack_rows[(name, "seeker")] = dict(honest=acc_h, cheat=acc_c, failed=failed, groups=len(items),
                                         refused_after=refused_after, flips=sum(int((x > FLIP_MARGIN).sum()) for x in m.margins),
                                         tokens=sum(len(x) for x in m.margins),
                                         exceed=sum(exceeding(x, args.margin, args.margin_hard) for x in m.margins))
    print(f"    (c) answer seeker within the hard bound {args.margin_hard:g}: accuracy {acc_c:.2%} vs honest {acc_h:.2%} "
          f"({(acc_c - acc_h) * 100:+.1f} points); groups failed {share(failed, len(items))}; flips "
          f"{attack_rows[(name, 'seeker')]['flips']}/{attack_rows[(name, 'seeker')]['tokens']}, past the margin "
          f"{attack_rows[(name, 'seeker')]['exceed']}; refused by the audit "
          f"after {refused_after if refused_after else 'never, in'} {'groups' if refused_after else str(len(items)) + ' groups'}")
    if WRITE is not None:
        WRITE()


def cost(model32, vocab: int, args, table_cost: list) -> None:
    """The race (the engine's picker: race + behaviour log-probs) against transformers' multinomial."""
    device = next(model32.parameters()).device
    for dtype in args.dtypes[:1]:  # the precision samplers default to on GPUs
        sampler = copy.deepcopy(model32).to(DTYPES[dtype])
        for batch in args.cost_batches:
            g = torch.Generator().manual_seed(batch)
            prompts = torch.randint(1, vocab, (batch // 8, args.prompt_len), generator=g).tolist()
            params = SamplingParams(n=8, temperature=1.0, max_new_tokens=args.cost_tokens)
            seeds = [group_seeds(bytes(16), f"c{i}", "s", 8) for i in range(len(prompts))]
            generate(sampler, prompts, dataclasses.replace(params, max_new_tokens=4), seeds, batch, None, 0)  # warm-up
            times = {"race": [], "plain": []}
            for _ in range(args.cost_repeats):
                for kind in ("race", "plain"):
                    _, t = generate(sampler, prompts, params, seeds, batch, None, 0, plain=kind == "plain")
                    times[kind].append(t)
            race, plain = min(times["race"]), min(times["plain"])
            table_cost.append(dict(dtype=dtype, batch=batch, race=race, plain=plain, tokens=batch * args.cost_tokens))
            if WRITE is not None:
                WRITE()
            print(f"  cost, {dtype} batch {batch}, {args.cost_tokens} tokens: race + log-probs {race:.2f} s, "
                  f"transformers' multinomial {plain:.2f} s: {race / plain - 1:+.1%} (best of {args.cost_repeats}, {device})")
        del sampler


def markdown(table: list[dict], attack_rows: dict, costs: list[dict], args, device_name: str) -> str:
    lines = [f"Device: {device_name}. Margin {args.margin:g} logits (exceedance test at rate {args.exceed_rate:g}), "
             f"hard bound {args.margin_hard:g}; flip test at rate "
             f"{'calibrated per model (in the log), at most ' if args.calibrate else ''}{args.flip_rate:g}; "
             f"each test at alarm {args.alarm / 2:g}. Command: `python examples/bench_bf16_audit.py "
             f"{' '.join(sys.argv[1:])}`", "",
             "| model | sampler | groups | tokens | flips | margin p99 / p99.9 / max | exceedances (95% upper) | "
             "honest groups failed (95% upper) | groups with a margin past " + " / ".join(f"{t:g}" for t in TOLERANCES) + " | "
             "flip / exceedance test refuses within 10k groups | k3 / tokens past clip | tokens/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['model']} | {r['sampler']} | {r['groups']} | {r['tokens']} | {r['flip_share']:.3%} | "
                     f"{r['p99']:.2g} / {r['p999']:.2g} / {r['max']:.2g} | {r['exceed']} ({r['exceed_hi']:.2e}) | "
                     f"{r['failed']} ({r['failed_hi']:.3%}) | {' / '.join(str(r['failed_at'][t]) for t in TOLERANCES)} | "
                     f"{r['alarm10k']:.2%} / {r['exceed_alarm10k']:.2%} | {r['k3']:.1e} / {r['clip']:.2%} | {r['tokens_per_s']:.0f} |")
    lines += ["", "| model | attack | caught per audited group |", "|---|---|---|"]
    for (name, how), v in attack_rows.items():
        if how == "seeker":
            lines.append(f"| {name} | (c) answer seeker | accuracy {v['cheat']:.2%} vs honest {v['honest']:.2%}; "
                         f"{v['failed']}/{v['groups']} groups failed; flips {v['flips']}/{v['tokens']}, past the margin "
                         f"{v['exceed']}; refused after "
                         f"{v['refused_after'] or 'never in ' + str(v['groups'])} groups |")
        else:
            lines.append(f"| {name} | ({'a' if how == 'answer' else 'b'}) {how} | {share(*v[:2])}; done in every group, "
                         f"refused after {f'{v[2]:.2f}' if v[2] else 'more than ' + str(v[1])} audited groups on average |")
    if costs:
        lines += ["", "| race cost: dtype | batch | tokens | race + log-probs (s) | multinomial (s) | extra |",
                  "|---|---|---|---|---|---|"]
        for c in costs:
            lines.append(f"| {c['dtype']} | {c['batch']} | {c['tokens']} | {c['race']:.2f} | {c['plain']:.2f} | "
                         f"{c['race'] / c['plain'] - 1:+.1%} |")
    return "\n".join(lines) + "\n"


PRESETS = {
    "cpu": dict(groups=64, mid_groups=16, big_groups=4, batches=[1, 32], lengths=[128], big_lengths=[128],
                big_layers=2, cost_batches=[32], cost_tokens=32),
    "gpu": dict(groups=2048, mid_groups=128, big_groups=32, batches=[1, 32, 128], lengths=[128, 1024],
                big_lengths=[128, 1024], big_layers=28, cost_batches=[128], cost_tokens=128),
    "smoke": dict(groups=16, mid_groups=4, big_groups=2, batches=[1, 8], lengths=[16, 300], big_lengths=[16],
                  big_layers=1, cost_batches=[8], cost_tokens=8),
}


def filters(params: SamplingParams) -> str:
    """'T=0.6, top-p 0.95, top-k 20': the sampling setting, for the table's labels."""
    return ", ".join([f"T={params.temperature:g}"] + ([f"top-p {params.top_p:g}"] if params.top_p < 1 else [])
                     + ([f"top-k {params.top_k}"] if params.top_k else []))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(PRESETS), default="cpu", help="sizes (the options below override)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", nargs="+", default=["builtin", "mid", "big"], choices=["builtin", "mid", "big"])
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"], choices=["bfloat16", "float16"])
    ap.add_argument("--groups", type=int, help="groups of 8 per setting, built-in model")
    ap.add_argument("--mid-groups", type=int)
    ap.add_argument("--big-groups", type=int)
    ap.add_argument("--batches", type=int, nargs="+", help="rows per generate call")
    ap.add_argument("--lengths", type=int, nargs="+", help="completion tokens, mid model")
    ap.add_argument("--big-lengths", type=int, nargs="+", help="completion tokens, big model")
    ap.add_argument("--big-layers", type=int, help="layers of the Qwen3-0.6B shape (28 is the real one)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--per-pass", type=int, default=16, help="groups per audit forward pass")
    ap.add_argument("--margin", type=float, default=AuditConfig.margin, help="the audit's tolerance (logits)")
    ap.add_argument("--margin-hard", type=float, default=AuditConfig.margin_hard,
                    help="the audit's hard bound (logits): a margin past it fails its group")
    ap.add_argument("--exceed-rate", type=float, default=AuditConfig.exceed_rate,
                    help="the exceedance test's honest ceiling (tokens past --margin per position)")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (every model)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus filter (every model)")
    ap.add_argument("--top-k", type=int, default=0, help="top-k filter (every model; 0: none)")
    ap.add_argument("--filter-slack", type=float,
                    help="logits of slack the audit applies top-k / top-p with (default: --margin, as the learner "
                         "does; 0: the filters exactly, as before protocol 2's slack)")
    ap.add_argument("--flip-rate", type=float, default=AuditConfig.flip_rate)
    ap.add_argument("--alarm", type=float, default=AuditConfig.alarm)
    ap.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="hold samplers to --flip-rate itself, not the rate measured on the model (node/audit.FlipRate)")
    ap.add_argument("--vllm", action="store_true", help="also sample the built-in model with vLLM (its venv)")
    ap.add_argument("--cost", action="store_true", help="time the race against multinomial sampling (big model)")
    ap.add_argument("--cost-batches", type=int, nargs="+")
    ap.add_argument("--cost-tokens", type=int)
    ap.add_argument("--cost-repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, help="also write the tables (markdown) here")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    args.rate_now = args.flip_rate  # the flip test's rate: --flip-rate, or calibrated per model
    for k, v in PRESETS[args.preset].items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.slack = args.margin if args.filter_slack is None else args.filter_slack  # the learner's: its margin
    device = torch.device(args.device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    rng = random.Random(0)
    table: list[dict] = []
    attack_rows: dict = {}
    costs: list[dict] = []
    global WRITE
    if args.out:  # the tables so far after every setting: a run cut short keeps what it measured
        WRITE = lambda: args.out.write_text(markdown(table, attack_rows, costs, args, device_name))  # noqa: E731
    if "builtin" in args.models:
        from node.sampling.params import SamplingConfig
        from node.models import BUILTIN_MODEL, eos_token_ids, load_model, load_tokenizer
        from node.tasks import ArithmeticConfig, make_task

        tok, model = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL).eval().to(device)
        task = make_task(ArithmeticConfig())
        pool = list(task.split("train"))
        problems = [pool[i % len(pool)] for i in range(args.groups)]
        prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
        answers = [tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for p in problems]
        params = SamplingConfig(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k).params
        run_model(f"built-in (trained, {filters(params)})", model, prompts, params, tok.pad_token_id,
                  eos_token_ids(tok, BUILTIN_MODEL), args.dtypes, args.batches, args, rng, table, attack_rows,
                  answers=answers, task=task, problems=problems)
    for kind in [k for k in ("big", "mid") if k in args.models]:  # the 151k shape first: the one that matters
        model = random_model(kind, args.big_layers, device)
        vocab = model.config.vocab_size
        n_groups = args.mid_groups if kind == "mid" else args.big_groups
        for length in (args.lengths if kind == "mid" else args.big_lengths):
            g = torch.Generator().manual_seed(length)
            groups = max(2, n_groups * 128 // max(length, 128))  # the same tokens per setting at every length
            prompts = torch.randint(1, vocab, (groups, args.prompt_len), generator=g).tolist()
            params = SamplingParams(n=8, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                    max_new_tokens=length)
            label = ("Qwen3 8 layers, vocabulary 32,768" if kind == "mid" else
                     f"Qwen3-0.6B shape, {model.config.num_hidden_layers} layers, vocabulary 151,936") + \
                f", {length} tokens" + ("" if filters(params) == "T=1" else f", {filters(params)}")
            run_model(label, model, prompts, params, 0, None, args.dtypes, args.batches, args, rng, table, attack_rows)
        if kind == "big" and args.cost:
            cost(model, vocab, args, costs)
        del model
    text = markdown(table, attack_rows, costs, args, device_name)
    print("\n" + text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
