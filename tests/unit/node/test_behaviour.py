"""The learner's own behaviour log-probs (`behaviour_logprobs = "learner"`, node/learner/behaviour.py):
computed as a training step computes them, an on-policy ratio of 1 with a bfloat16 sampler,
forged claims dropped and counted, and claims kept where the version cannot be rebuilt. Over the
real protocol: tests/integration/node/test_behaviour_wire.py."""

from __future__ import annotations

from node.learner.config import AuditConfig, BehaviourConfig

import math

import pytest
import torch

from helpers.inmemory import tiny_swarm
from node.algorithms import has_signal
from node.learner import LearnerConfig
from node.learner.behaviour import Mismatch, claim_error, learner_logprobs
from node.learner.groups import BufferedGroup, Route
from node.training.logprobs import completion_logprobs, completion_span, pack
from node.models import BUILTIN_MODEL, load_model
from node.training.batch import ScoredGroup
from node.training.step import StepOptions
from node.engines.base import Completion


def _group(prompt: list[int], completions: list[list[int]], claims: float = -1.0) -> ScoredGroup:
    return ScoredGroup("p", prompt, [Completion(c, "", [claims] * len(c), "length") for c in completions],
                       [0.0] * len(completions), BUILTIN_MODEL, 0)


def test_learner_logprobs_are_each_rows_own_forward_whatever_the_micro_batches():
    # float64: padding and micro-batch composition then move nothing past 1e-12
    model = load_model(BUILTIN_MODEL).double().eval()
    groups = [_group([5, 6, 7], [[8, 9], [10], [11, 12, 13, 14]]), _group([20], [[21, 22, 23], [24]])]
    for budget in (None, 8, 1):  # the whole step at once, a few rows a pass, one row a pass
        got = learner_logprobs(model, groups, 0.7, 0, StepOptions(budget))
        for g, per_comp in zip(groups, got):
            for c, lps in zip(g.completions, per_comp):
                alone = completion_logprobs(model, pack([g.prompt_ids], [c.token_ids], 0), 0.7)[0]
                want = alone[completion_span(len(g.prompt_ids), len(c.token_ids))].tolist()
                assert len(lps) == len(c.token_ids)
                assert max(abs(a - b) for a, b in zip(lps, want)) < 1e-12, budget


def test_the_mismatch_figures_by_hand():
    d = claim_error([-1.0, -2.0], [-1.1, -1.5])  # log q/p = [0.1, -0.5]
    assert d.tolist() == pytest.approx([0.1, -0.5], abs=1e-12)
    m = Mismatch()
    m.add(d)
    s = m.stats()
    assert s["behaviour_gap_mean"] == pytest.approx(0.3, abs=1e-12)
    # k3 of d = log q/p, as the step's kl_k3: (e^0.1 - 1 - 0.1 + e^-0.5 - 1 + 0.5) / 2
    assert s["behaviour_k3"] == pytest.approx((0.00517091808 + 0.10653065971) / 2, abs=1e-10)
    assert s["behaviour_clip_share"] == 0.5  # p/q: |e^0.5 - 1| = 0.65 > 0.2; |e^-0.1 - 1| = 0.095 is not


def _step(mode: str, sampler_dtype: torch.dtype, tamper=None, rollout_is_cap: float | None = None) -> tuple[dict, object]:
    behaviour = BehaviourConfig(source=mode, **({} if rollout_is_cap is None else {"rollout_is_cap": rollout_is_cap}))
    s = tiny_swarm(groups_per_step=4, samplers=1, start=True, behaviour=behaviour, audit=AuditConfig(first=0, rate=0.0))
    s.samplers[0].engine.model.to(sampler_dtype)  # a GPU volunteer's engine; the learner stays float32
    s.samplers[0].maybe_update(s.link("s0"))
    # groups with a reward signal: a step whose groups all score alike trains on nothing (no routes)
    groups: list = []
    for _ in range(20):  # how many of 16 have signal varies from run to run (the version's nonce seeds them)
        groups += [g for g in s.samplers[0].produce(16) if has_signal([c.reward for c in g.completions])]
        if len(groups) >= 4:
            break
    groups = groups[:4]
    assert len(groups) == 4
    if tamper:
        tamper(groups)
    assert sum(s.learner.ingest(g.encode()) is None for g in groups) == 4
    return s.learner.step(), s


def test_with_the_learners_log_probs_a_bfloat16_samplers_on_policy_ratio_is_one():
    claimed, _ = _step("sampler", torch.bfloat16)
    mine, _ = _step("learner", torch.bfloat16)
    # the sampler's bfloat16 claims put its engine's error into every ratio...
    assert claimed["routes"]["own"]["kl_k3"] > 1e-6
    # ...the learner's own do not: p and q are the same model's float32 forwards on the same weights,
    # apart by at most twice float32_logprob_tol per token (1.1e-5 on the built-in model: 99 tokens,
    # |logits| under 10), so k3 ~ d^2 / 2 <= 2.5e-10
    assert mine["routes"]["own"]["kl_k3"] < 1e-9
    assert mine["behaviour_recomputed"] == 4 and mine["behaviour_claims_kept"] == 0
    # and the step record says how far the claims were (what the sampler's engine would have cost)
    assert mine["behaviour_k3"] > 1e-6 and 0 < mine["behaviour_gap_mean"] < 0.1
    assert "behaviour_k3" not in claimed


def test_a_group_whose_claims_are_forged_is_dropped_from_the_step_and_counted():
    def forge(groups):
        for c in groups[1].completions:
            c.logprobs = [-18.0] * len(c.token_ids)

    rec, s = _step("learner", torch.float32, forge)
    assert rec["drops"]["logprob_gap"] == 1 and rec["logprob_gap_drops"] == {"s0": 1}
    assert rec["groups_own"] == 3 and rec["behaviour_recomputed"] == 4
    # the forged claims are not in the figures of the honest ones: a float32 engine and the learner
    # differ by at most twice float32_logprob_tol per token (2.2e-5 here; ~1e-6 measured), the forged by ~18
    assert rec["behaviour_gap_mean"] < 1e-4


def test_the_rollout_correction_weighs_the_claims_engine_and_bounds_a_lowered_claim_at_the_cap():
    honest, _ = _step("learner", torch.bfloat16, rollout_is_cap=2.0)
    own = honest["routes"]["own"]
    # a bfloat16 engine on the built-in model: weights within rounding of 1, none at the cap
    assert own["rollout_weight_mean"] == pytest.approx(1.0, abs=0.05) and own["rollout_truncated_frac"] == 0

    def lower(groups):  # claims 1 nat a token below the truth: weight e > 2, under the log-prob check's 4
        for c in groups[0].completions:
            c.logprobs = [lp - 1.0 for lp in c.logprobs]

    rec, _ = _step("learner", torch.float32, lower, rollout_is_cap=2.0)
    own = rec["routes"]["own"]
    assert rec["drops"].get("logprob_gap", 0) == 0 and rec["groups_own"] == 4
    # the lowered group's tokens weigh 2 (the cap), not e: a quarter of the sequences, all truncated
    assert own["rollout_truncated_frac"] == pytest.approx(0.25, abs=1e-9)
    assert own["rollout_weight_mean"] == pytest.approx(0.25 * 2.0 + 0.75 * 1.0, abs=1e-4)
    off, _ = _step("learner", torch.float32, lower, rollout_is_cap=0.0)
    assert "rollout_weight_mean" not in off["routes"]["own"]  # rollout_is_cap = 0: no weights


def test_the_audit_copy_is_let_go_before_the_training_step():
    s = tiny_swarm(groups_per_step=4, samplers=1, start=True, behaviour=BehaviourConfig(source="learner"))  # audits on: 4 first
    held, train = [], s.learner.training.train
    s.learner.training.train = lambda *a: (held.append(s.learner.auditor._copy), train(*a))[1]
    s.samplers[0].run_once(s.link("s0"), 4)
    s.learner.ingest_many(s.exchange.receive_rollouts(100))
    rec = s.learner.step()
    assert rec["audit"]["audits"] == 4 and rec["behaviour_recomputed"] == 4 and held == [None]


def test_greedy_sampling_takes_log_probs_at_temperature_one_not_zero():
    from node.sampling.params import SamplingConfig
    from node.learner import Learner
    from node.models import load_tokenizer
    from node.tasks import ArithmeticConfig, make_task

    tok = load_tokenizer(BUILTIN_MODEL)
    learner = Learner(LearnerConfig(behaviour=BehaviourConfig(source="learner"), eval_every=0, eval_size=20), load_model(BUILTIN_MODEL),
                      tok, make_task(ArithmeticConfig(), tok), model_id=BUILTIN_MODEL,
                      sampling=SamplingConfig(temperature=0.0))
    # as samplers and audits take them (a 0 made every log-prob NaN and every step skipped)
    assert learner.training.temperature == 1.0 and learner.recompute.temperature == 1.0


def test_a_version_the_learner_cannot_rebuild_keeps_the_samplers_claims():
    s = tiny_swarm(start=True, behaviour=BehaviourConfig(source="learner"))  # version 0 of its chain published
    chain = s.learner.chain
    taken = [BufferedGroup(_group([5, 6], [[7, 8]], -2.0), Route.OWN, "a", b"", "old-chain", 3),
             BufferedGroup(_group([5, 6], [[7, 8]], -2.0), Route.OWN, "b", b"", chain, 0),
             BufferedGroup(_group([5, 6], [[7, 8]], -2.0), Route.FOREIGN, "f", b"", "", 0)]
    kept, dropped, rec = s.learner.recompute(taken)
    s.learner.auditor.release()
    assert kept == taken and dropped == []
    assert rec["behaviour_recomputed"] == 1 and rec["behaviour_claims_kept"] == 1
    assert taken[0].group.completions[0].logprobs == [-2.0, -2.0]  # not rebuildable: as claimed
    assert taken[2].group.completions[0].logprobs == [-2.0, -2.0]  # another model's: F-TIS's, as claimed
    assert all(math.isfinite(x) and x != -2.0 for x in taken[1].group.completions[0].logprobs)


def test_a_recomputation_that_fails_leaves_the_claims_and_the_step_goes_on(caplog):
    s = tiny_swarm(start=True, behaviour=BehaviourConfig(source="learner"))
    vocab = load_model(BUILTIN_MODEL).config.vocab_size
    # a token past the embedding makes the forward itself raise (as an out-of-memory would)
    taken = [BufferedGroup(_group([5, 6], [[7, vocab + 5]], -2.0), Route.OWN, "a", b"", s.learner.chain, 0)]
    kept, dropped, rec = s.learner.recompute(taken)
    s.learner.auditor.release()
    assert kept == taken and rec["behaviour_claims_kept"] == 1 and rec["behaviour_recomputed"] == 0
    assert taken[0].group.completions[0].logprobs == [-2.0, -2.0]
    assert "their samplers' claims are used" in caplog.text


def test_an_unknown_source_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="learner.behaviour: need source sampler, learner or auto"):
        LearnerConfig(behaviour=BehaviourConfig(source="engine"))
