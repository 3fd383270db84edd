"""How far honest behaviour log-probs are from the learner's own: the bound `max_logprob_gap` must sit above.

    python examples/bench_logprob_gap.py [--steps 96] [--lr 3e-5]

Trains the built-in model as the demo does (simulator, one fresh sampler, the learner's default loss, the demo's
lr and batch), keeps the learner's weights at every version, then samples groups (checkable, as
samplers do) with the weights of version v and measures, for staleness s, the per-sequence gap

    gap_i = mean_t |l^{v+s}_{i,t} - l^v_{i,t}|        (node/training/step.py, logprob_gap)

that the learner sees when it trains at version v+s on rollouts of version v. Prints mean, p99
and max beside the default bound, and the gap a liar claiming -18/token produces. Engine
numerics (vLLM vs HF at the same weights) are measured by tests/unit/node/test_vllm.py.
"""

from __future__ import annotations

import argparse
import copy
import logging

import torch

from cli.config import SimSamplerSpec, SimulatorConfig
from cli.simulate import Simulator
from node.sampling.race import BASE_NONCE, completion_seed
from node.sampling.params import SamplingConfig
from node.engines.hf import HFEngine
from node.learner import LearnerConfig
from node.training.logprobs import completion_logprobs, completion_span, pack
from node.models import BUILTIN_MODEL, load_model, load_tokenizer
from node.training.batch import logprob_gap


def honest_groups(weights, tok, problems, sampling):
    engine = HFEngine(load_model(BUILTIN_MODEL), tok, BUILTIN_MODEL)
    engine.model.load_state_dict(weights)
    seeds = [[completion_seed(BASE_NONCE, p.id, "probe", j) for j in range(sampling.group_size)] for p in problems]
    return engine.generate([p.prompt for p in problems], sampling.params, seeds)


@torch.no_grad()
def gaps(weights, tok, results, temperature: float, claim: float | None = None) -> torch.Tensor:
    model = load_model(BUILTIN_MODEL)
    model.load_state_dict(weights)
    rows = [(r.prompt_token_ids, c) for r in results for c in r.completions]
    batch = pack([p for p, _ in rows], [c.token_ids for _, c in rows], tok.pad_token_id)
    old = torch.zeros_like(batch.completion_mask, dtype=torch.float32)
    for i, (p, c) in enumerate(rows):
        old[i, completion_span(len(p), len(c.token_ids))] = torch.tensor(
            c.logprobs if claim is None else [claim] * len(c.token_ids))
    return logprob_gap(completion_logprobs(model.eval(), batch, temperature), old, batch.completion_mask)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--prompts", type=int, default=32, help="prompts sampled at each probed version")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sampling = SamplingConfig()
    sim = Simulator(SimulatorConfig(learner=LearnerConfig(lr=args.lr, eval_every=0, eval_size=50),
                                    samplers=(SimSamplerSpec(count=1),), steps=args.steps, sampling=sampling))
    snapshots = {0: copy.deepcopy(sim.learner.model.state_dict())}
    step = sim.learner.step

    def step_and_keep():
        rec = step()
        if rec is not None:
            snapshots[sim.learner.version] = copy.deepcopy(sim.learner.model.state_dict())
        return rec

    sim.learner.step = step_and_keep
    sim.run()
    tok = load_tokenizer(BUILTIN_MODEL)
    problems = sim.task.split("train")[: args.prompts]
    bound = LearnerConfig().behaviour.max_logprob_gap
    print(f"built-in model, lr {args.lr}, {args.steps} versions, {args.prompts} prompts x {sampling.group_size}; "
          f"bound max_logprob_gap = {bound}")
    print(f"{'from v':>6} {'stale s':>7} {'mean':>8} {'p99':>8} {'max':>8}")
    for v in (0, args.steps // 3):
        results = honest_groups(snapshots[v], tok, problems, sampling)
        for s in (0, 1, 4, 16, 32, 64):
            if v + s in snapshots:
                g = gaps(snapshots[v + s], tok, results, sampling.temperature)
                print(f"{v:>6} {s:>7} {g.mean():8.4f} {g.quantile(0.99):8.4f} {g.max():8.4f}")
    liar = gaps(snapshots[0], tok, honest_groups(snapshots[0], tok, problems, sampling), sampling.temperature, claim=-18.0)
    print(f"a liar claiming -18/token at s = 0: gap mean {liar.mean():.2f}, min {liar.min():.2f}")


if __name__ == "__main__":
    main()
