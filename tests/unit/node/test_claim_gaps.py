"""Each sampler's claim gap and `behaviour_logprobs = "auto"` (node/audit/claim_gaps.py): the
estimate by hand, the audit's measure of it, and a learner that recomputes the groups of samplers
whose claims sit far (or are not measured yet) and trains on the claims of those that sit close."""

from __future__ import annotations

from node.learner.config import AuditConfig, BehaviourConfig

import math

import pytest
import torch

from helpers.inmemory import tiny_swarm
from node.algorithms import has_signal
from node.algorithms.base import k3
from node.learner import LearnerConfig
from node.audit.claim_gaps import ClaimGaps, decayed


def test_the_decayed_estimate_by_hand():
    # 1,000 tokens of k3 sum 2 after (weights of) 3,000 of sum 3, half-life 1,000: the older weigh 1/2,
    # the new ones 1/2 * 1000 / ln 2 = 721.35 tokens' worth (each by its own age)
    fresh = 500 / math.log(2)
    assert decayed(3.0, 3000.0, 2.0, 1000, 1000.0) == pytest.approx((1.5 + fresh * 2e-3, 1500 + fresh), rel=1e-12)
    # a few tokens count about as many; without decay, exactly
    assert decayed(0.0, 0.0, 1.0, 10, 1e6)[1] == pytest.approx(10, rel=1e-4)
    assert decayed(3.0, 3000.0, 2.0, 1000, math.inf) == (5.0, 4000.0)
    # the steady count: half_life / ln 2, however the tokens are batched
    one, many = (0.0, 0.0), (0.0, 0.0)
    one = decayed(*one, 1.0, 100_000, 1000.0)
    for _ in range(1000):
        many = decayed(*many, 0.001, 100, 1000.0)
    assert one[1] == pytest.approx(1000 / math.log(2), rel=1e-6) and many[1] == pytest.approx(one[1], rel=1e-6)
    g = ClaimGaps(threshold=1e-3, half_life=1000.0, min_tokens=100)
    g.add("a", 3.0, 3000)
    g.add("a", 2.0, 1000)
    assert g.k3("a") == pytest.approx(decayed(*decayed(0, 0, 3.0, 3000, 1000.0), 2.0, 1000, 1000.0)[0]
                                      / decayed(*decayed(0, 0, 3.0, 3000, 1000.0), 2.0, 1000, 1000.0)[1], rel=1e-12)


def test_unmeasured_samplers_are_far_until_enough_tokens_then_the_threshold_decides():
    g = ClaimGaps(threshold=1e-3, min_tokens=256, half_life=math.inf)  # (a count that does not decay)
    assert g.k3("a") is None and g.far("a")
    g.add("a", 255 * 1e-5, 255)
    assert g.k3("a") is None and g.far("a")  # one token short of believing it
    g.add("a", 1e-5, 1)
    assert g.k3("a") == pytest.approx(1e-5, rel=1e-9) and not g.far("a")
    g.add("b", 300 * 2e-3, 300)
    assert g.far("b")
    assert g.stats() == {"measured": 2, "far": 1, "k3_max": pytest.approx(2e-3, rel=1e-9)}


def test_nothing_measured_or_nan_changes_nothing():
    g = ClaimGaps(threshold=1e-3, min_tokens=1)
    g.add("a", 0.0, 0)
    g.add("a", float("nan"), 500)
    assert g.k3("a") is None and g.far("a")


def test_an_engine_that_changes_is_seen_within_a_half_life():
    g = ClaimGaps(threshold=1e-3, half_life=1000.0, min_tokens=100)
    g.add("a", 20_000 * 1e-5, 20_000)  # a long record in float32...
    assert not g.far("a")
    for _ in range(10):  # ...then 1,000 tokens in an engine 10x past the threshold
        g.add("a", 100 * 1e-2, 100)
    assert g.far("a")


def test_forgetting_keeps_the_newest_samplers_and_errs_on_recomputing():
    g = ClaimGaps(threshold=1e-3, min_tokens=1, max_samplers=3)
    for s in "abcd":
        g.add(s, 1e-6, 10)
    assert g.k3("a") is None and g.far("a")  # forgotten: unmeasured again, so recomputed
    assert all(not g.far(s) for s in "bcd")
    g2 = ClaimGaps(threshold=1e-3, min_tokens=1, max_samplers=3)
    g2.load_state_dict(g.state_dict())
    assert [g2.k3(s) for s in "abcd"] == [g.k3(s) for s in "abcd"]


def test_an_audit_measures_the_claims_k3_against_the_recomputed_log_probs():
    from node.audit.margins import AuditItem, audit_groups
    from node.sampling.race import group_seeds
    from node.sampling.params import SamplingParams
    from node.training.logprobs import completion_logprobs, completion_span, pack
    from node.models import BUILTIN_MODEL, load_model, load_tokenizer

    tok, model = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL).eval()
    params = SamplingParams(n=2, temperature=0.7, max_new_tokens=5)
    prompt = tok("12+7=", add_special_tokens=False)["input_ids"]
    comps = [([5, 6, 7], [-1.0, -2.0, -0.5]), ([8, 9], [-3.0, -0.1])]
    r = audit_groups(model, [AuditItem(prompt, comps, group_seeds(bytes(16), "p", "s", 2))], params,
                     tok.pad_token_id, tol=100.0)[0]
    want = 0.0
    for toks, claimed in comps:
        with torch.no_grad():
            mine = completion_logprobs(model, pack([prompt], [toks], tok.pad_token_id), 0.7)[0]
        mine = mine[completion_span(len(prompt), len(toks))].double()
        want += float(k3(torch.tensor(claimed, dtype=torch.float64) - mine).sum())
    assert r.positions == 5 and r.claim_k3 == pytest.approx(want, rel=1e-5)


# ---- a learner in "auto" ------------------------------------------------------------------------

def _auto(sampler_dtype: torch.dtype, threshold: float, **overrides):
    # 8 groups a step: the arithmetic task's answers are short (~15 tokens a group of 4), and an
    # estimate is believed from MIN_TOKENS (64) on
    s = tiny_swarm(groups_per_step=8, samplers=1, start=True, behaviour=BehaviourConfig(source="auto", auto_k3=threshold), **{"audit": AuditConfig(first=8), **overrides})
    s.samplers[0].engine.model.to(sampler_dtype)  # a GPU volunteer's engine; the learner stays float32
    s.samplers[0].maybe_update(s.link("s0"))
    return s


def _feed(s, n: int = 8) -> None:
    # groups with a reward signal, so that every step trains and its record has routes to compare
    groups = [g for g in s.samplers[0].produce(4 * n) if has_signal([c.reward for c in g.completions])][:n]
    assert len(groups) == n
    assert sum(s.learner.ingest(g.encode()) is None for g in groups) == n


def test_auto_trains_on_the_claims_of_a_sampler_its_audits_found_close():
    s = _auto(torch.float32, 1e-3)  # audits on: a new sampler's first 8 groups
    _feed(s)
    rec = s.learner.step()
    assert rec["audit"]["audits"] == 8
    assert rec["claim_gaps"]["measured"] == 1 and rec["claim_gaps"]["far"] == 0
    assert rec["claim_gaps"]["k3_max"] < 1e-8  # a float32 engine on the same weights: rounding
    assert rec["behaviour_claims_close"] == 8 and rec["behaviour_recomputed"] == 0


def test_auto_recomputes_a_sampler_whose_claims_sit_far_and_so_trains_at_a_ratio_of_one():
    s = _auto(torch.bfloat16, 1e-7)  # a threshold under bfloat16's ~1e-4: this engine is "far"
    _feed(s)
    rec = s.learner.step()
    assert rec["claim_gaps"]["far"] == 1 and rec["claim_gaps"]["k3_max"] > 1e-7
    assert rec["behaviour_recomputed"] == 8 and rec["behaviour_claims_close"] == 0
    assert rec["routes"]["own"]["kl_k3"] < 1e-9  # the learner's own log-probs: p = q on-policy


@pytest.mark.parametrize("dtype,far", [(torch.float32, 0), (torch.bfloat16, 1), (torch.float16, 1)])
def test_the_default_threshold_keeps_a_float32_engines_claims_and_recomputes_any_other_precisions(dtype, far):
    s = _auto(dtype, LearnerConfig().behaviour.auto_k3)
    _feed(s)
    rec = s.learner.step()
    assert rec["claim_gaps"]["measured"] == 1 and rec["claim_gaps"]["far"] == far
    # each engine's gap sits 10x or more from the threshold, on its side (float32: rounding)
    k3_, threshold = rec["claim_gaps"]["k3_max"], LearnerConfig().behaviour.auto_k3
    assert (k3_ > 10 * threshold) if far else (k3_ < threshold / 10)


def test_auto_recomputes_an_unmeasured_sampler_and_measures_it_so():
    s = _auto(torch.float32, 1e-3, audit=AuditConfig(first=0, rate=0.0, rate_established=0.0))  # never audited
    _feed(s)
    first = s.learner.step()
    assert first["audit"]["audits"] == 0
    assert first["behaviour_recomputed"] == 8  # not measured yet: recomputed, and measured by it
    assert first["claim_gaps"]["measured"] == 1 and first["claim_gaps"]["far"] == 0
    s.samplers[0].maybe_update(s.link("s0"))
    _feed(s)
    second = s.learner.step()
    assert second["behaviour_claims_close"] == 8 and second["behaviour_recomputed"] == 0
    assert math.isfinite(second["claim_gaps"]["k3_max"])


def test_the_estimates_survive_a_checkpoint(tmp_path):
    s = _auto(torch.float32, 1e-3)
    _feed(s)
    s.learner.step()
    path = s.learner.save_checkpoint(tmp_path)
    t = _auto(torch.float32, 1e-3)
    t.learner.load_checkpoint(path)
    sampler = next(iter(s.learner.auditor.audits))
    assert t.learner.auditor.claim_gaps.k3(sampler) == s.learner.auditor.claim_gaps.k3(sampler) is not None


def test_a_groups_claims_dropped_past_the_gap_count_toward_its_samplers_estimate():
    s = _auto(torch.float32, 1e-3, audit=AuditConfig(first=0, rate=0.0, rate_established=0.0))
    groups = s.samplers[0].produce(8)
    for c in groups[0].completions:
        c.logprobs = [-18.0] * len(c.token_ids)  # forged: dropped by the recomputation's check
    assert sum(s.learner.ingest(g.encode()) is None for g in groups) == 8
    rec = s.learner.step()
    assert rec["drops"]["logprob_gap"] == 1
    assert rec["claim_gaps"]["far"] == 1  # the forged group's gap is in the estimate: far, recomputed
    assert rec["behaviour_k3"] < 1e-8  # and not in the step's figures of the claims it kept


def test_a_learner_in_bfloat16_measures_the_gap_against_its_own_compute_not_the_audits_float32():
    from node.sampling.params import SamplingConfig
    from node.learner import Learner, LearnerConfig
    from node.models import BUILTIN_MODEL, load_model, load_tokenizer
    from node.tasks import ArithmeticConfig, make_task

    tok = load_tokenizer(BUILTIN_MODEL)

    def learner(dtype):
        return Learner(LearnerConfig(eval_every=0, eval_size=20), load_model(BUILTIN_MODEL), tok,
                       make_task(ArithmeticConfig(), tok), model_id=BUILTIN_MODEL, sampling=SamplingConfig(),
                       compute_dtype=dtype)

    f32, bf16 = learner(None), learner(torch.bfloat16)
    assert f32.auditor.measures_claims and f32.recompute.resample is None
    # p is bfloat16 here: the float32 audit would call a float32 sampler close where its ratio is not
    assert not bf16.auditor.measures_claims and bf16.recompute.resample == bf16.auditor.draw
    bf16.auditor.claim_gaps.add("close", 1e-12 * 100, 100)
    bf16.auditor.audits["close"] = 1  # short record: audit_rate (0.1)
    share = sum(bf16.recompute._wanted("close") for _ in range(4000)) / 4000
    assert abs(share - 0.1) < 0.03  # a close sampler's groups still recomputed at its audit rate
