"""The tail of an honest bfloat16 engine's audit margins on a model as it trains: what
AuditConfig.margin, margin_hard and exceed_rate are derived from, printed beside them.

    python examples/bench_margin_tail.py                                  # 240 steps, 4 measurements, ~20 min on 2 cores
    python examples/bench_margin_tail.py --steps 4 --at 2 4 --groups 2    # a smoke run

Trains builtin:tiny-chain-long under GRPO in the simulator with two bfloat16 samplers (the
replication's runs, docs/RESULTS.md "The cut" item 4, where one honest token past a 1-logit margin
refused its sampler for good) under the shipped audit, which refuses nobody honest or the run
stops. At each version in `--at` it takes the learner's weights: a bfloat16 engine (cast, each
linear layer multiplied in float32 as the simulator's samplers on a CPU) samples `--groups` groups
of 8 at T 0.6, top-p 0.95, top-k 20, and the float32 audit measures every position's margin
(node/audit/margins.margins_at, as the learner does). Per version: positions, flips, exceedances
(margins past `margin`) with their Wilson 95% upper end beside `exceed_rate`, the largest margin
beside `margin_hard`, and the engine's largest logit error on the 20 likeliest tokens (an honest
margin is at most about twice it); pooled, the most exceedances in one group and the mean of the
exceedance test's per-group likelihood ratio (at most 1 for an honest engine, or the test's
guarantee does not hold); then the run's own audits.
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.audit_parts import generate, measure  # noqa: E402
from node.audit.flips import FlipTest, flip_llr, wilson  # noqa: E402
from node.audit.margins import FLIP_MARGIN, AuditItem  # noqa: E402
from node.learner.config import AuditConfig  # noqa: E402
from node.sampling.race import group_seeds  # noqa: E402
from node.training.logprobs import completion_logits, pack  # noqa: E402

MODEL = "builtin:tiny-chain-long"


def train(args) -> tuple[dict[int, dict], dict]:
    """The learner's weights at each version of `args.at`, and its audits' counts at the end."""
    from cli.simulate import Simulator
    from examples.paper_delay import run as grid

    ns = argparse.Namespace(lr=3e-5, groups=8, eval_every=10_000, eval_size=200, behaviour_logprobs="sampler",
                            rollout_is_cap=0.0, model=MODEL, task="chain-long", group_size=8, temperature=0.6,
                            top_p=0.95, top_k=20, max_new_tokens=192, samplers=2, sampler_dtype="bfloat16",
                            sampler_matmul="float32", sampler_logit_error=0.0, steps=args.steps, threads=args.threads,
                            device="cpu", lag=False)
    sim = Simulator(grid.build_config("grpo", 0, args.seed, ns, str(args.metrics)))
    weights: dict[int, dict] = {}

    def keep(record: dict) -> None:
        if record.get("kind") == "step" and record["version"] in args.at:
            weights[record["version"]] = copy.deepcopy(sim.learner.model.state_dict())
            logging.info("version %d: weights kept", record["version"])

    sim.run(keep)
    return weights, dict(sim.learner.auditor.stats)


@torch.no_grad()
def logit_error(model32, model16, items: list[AuditItem], pad: int, top: int = 20) -> float:
    """The largest |bfloat16 - float32| logit over the `top` likeliest tokens at every position
    (a full forward of each; the engine's own, cached, decoding errs a little differently)."""
    worst = 0.0
    for it in items:
        batch = pack([it.prompt_ids] * len(it.completions), [c[0] for c in it.completions], pad)
        l32 = torch.cat([x for _, x in completion_logits(model32, batch)])
        l16 = torch.cat([x.float() for _, x in completion_logits(model16, batch)])
        idx = l32.topk(min(top, l32.shape[-1]), -1).indices
        worst = max(worst, float((l16 - l32).abs().gather(-1, idx).max()))
    return worst


def measure_at(version: int, state: dict, args, audit: AuditConfig) -> dict:
    from cli.simulate import float32_matmuls
    from node.models import eos_token_ids, load_model, load_tokenizer
    from node.sampling.params import SamplingConfig
    from node.tasks import ChainConfig, make_task

    tok, model32 = load_tokenizer(MODEL), load_model(MODEL).eval()
    model32.load_state_dict(state)
    model16 = copy.deepcopy(model32).to(torch.bfloat16)
    float32_matmuls(model16)
    pool = list(make_task(ChainConfig(min_terms=8, max_terms=12), tok).split("train"))
    problems = [pool[(i * 7919) % len(pool)] for i in range(args.groups)]  # spread over the pool
    prompts = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    params = SamplingConfig(group_size=8, temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=192).params
    seeds = [group_seeds(version.to_bytes(16, "little"), p.id, "bench", 8) for p in problems]
    groups, _ = generate(model16, prompts, params, seeds, 64, eos_token_ids(tok, MODEL), tok.pad_token_id)
    items = [AuditItem(p, g, s) for p, g, s in zip(prompts, groups, seeds)]
    m = measure(model32, items, params, tok.pad_token_id, per_pass=8, slack=audit.margin, hard=audit.margin_hard)
    x = torch.cat(m.margins)
    exceed = int(((x > audit.margin) & (x <= audit.margin_hard)).sum())
    # per group: the exceedance test's likelihood ratio, whose mean over honest groups must be <= 1
    # for its guarantee (Ville's inequality needs a supermartingale: clustered exceedances break it)
    per_group = [(int(((g > audit.margin) & (g <= audit.margin_hard)).sum()), len(g)) for g in m.margins]
    ratios = [math.exp(flip_llr(k, n, audit.exceed_rate, FlipTest.RATIO)) for k, n in per_group]
    return dict(version=version, positions=len(x), flips=int((x > FLIP_MARGIN).sum()), exceed=exceed,
                exceed_hi=wilson(exceed, len(x))[1], hard=int((x > audit.margin_hard).sum()), max=float(x.max()),
                error=logit_error(model32, model16, items, tok.pad_token_id), ratios=ratios,
                most=max(k for k, _ in per_group))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=240, help="learner steps (GRPO, lr 3e-5, 8 groups a step)")
    ap.add_argument("--at", type=int, nargs="+", default=[60, 120, 180, 240], help="versions to measure at")
    ap.add_argument("--groups", type=int, default=128, help="groups of 8 sampled and audited per version")
    ap.add_argument("--seed", type=int, default=202, help="the run's seed (202: a replication run an audit stopped)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--metrics", type=Path, default=Path("runs/bench_margin_tail.jsonl"), help="the run's records")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.metrics.parent.mkdir(parents=True, exist_ok=True)
    audit = AuditConfig()
    weights, stats = train(args)
    rows = [measure_at(v, weights[v], args, audit) for v in sorted(weights)]
    print(f"\nhonest bfloat16 engine on {MODEL}, {args.groups} groups of 8 a version (T 0.6, top-p 0.95, top-k 20):")
    print(f"| version | positions | flips | past margin {audit.margin:g} (95% upper) | exceed_rate | largest margin | "
          f"margin_hard | past it | largest logit error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['version']} | {r['positions']} | {r['flips']} | {r['exceed']} ({r['exceed_hi']:.1e}) | "
              f"{audit.exceed_rate:g} | {r['max']:.3g} | {audit.margin_hard:g} | {r['hard']} | {r['error']:.3g} |")
    total, n = sum(r["exceed"] for r in rows), sum(r["positions"] for r in rows)
    print(f"pooled: {total} of {n} positions past the margin, 95% upper {wilson(total, n)[1]:.1e} against exceed_rate "
          f"{audit.exceed_rate:g}")
    ratios = [q for r in rows for q in r["ratios"]]
    print(f"per group: at most {max(r['most'] for r in rows)} past the margin in one group; the exceedance test's "
          f"likelihood ratio averages {sum(ratios) / len(ratios):.3f} over {len(ratios)} honest groups (its "
          f"guarantee needs <= 1)")
    print(f"the run's own audits ({args.steps} steps): {stats['audits']} groups, {stats['positions']} positions, "
          f"{stats['flips']} flips, {stats['exceedances']} past the margin, {stats['failed']} failed; largest passed "
          f"margin {stats['margin_max']:.3g}")


if __name__ == "__main__":
    main()
