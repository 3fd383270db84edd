"""The rollout correction (`learner.rollout_is_cap`): where the learner recomputed a group's behaviour
log-probs, each token weighs min(p_ours / q_claimed, cap) in the loss, so the loss's ratio is taken
against the learner's policy while the tokens stay weighed for the engine that drew them."""

from __future__ import annotations

from node.learner.config import BehaviourConfig

import math

import pytest
import torch

from node.algorithms import get_algorithm
from node.algorithms.base import LossInputs
from node.engines.base import Completion
from node.learner import LearnerConfig
from node.learner.behaviour import with_logprobs
from node.training.batch import ScoredGroup, build_batch
from node.training.step import rollout_stats, rollout_weight

F64 = torch.float64


def _inputs(logp, old, adv, groups, weight=None, mask=None) -> LossInputs:
    logp = torch.tensor(logp, dtype=F64, requires_grad=True)
    return LossInputs(logp, torch.tensor(old, dtype=F64), torch.tensor(adv, dtype=F64),
                      torch.ones_like(logp, dtype=torch.bool) if mask is None else torch.tensor(mask),
                      torch.tensor(groups),
                      rollout_log_weight=None if weight is None else torch.tensor(weight, dtype=F64).log())


def _loss_and_grad(name: str, inp: LossInputs, **options) -> tuple[float, list]:
    algo = get_algorithm(name)
    out = algo.loss(inp, algo.make_config(options))
    out.loss.backward()
    return out.loss.item(), inp.logp.grad.flatten().tolist()


# ---- each loss, by hand ------------------------------------------------------------------------

def test_grpo_weighs_each_tokens_term_hand_values():
    # on-policy (ratio 1), A = 1, weights 0.5 and 2: seq_mean of -w r A = -(0.5 + 2) / 2;
    # d/dl^p_t of -w_t r_t A / 2 at r = 1 is -w_t / 2
    loss, grad = _loss_and_grad("grpo", _inputs([[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], [0], [[0.5, 2.0]]))
    assert loss == pytest.approx(-1.25, abs=1e-12)
    assert grad == pytest.approx([-0.25, -1.0], abs=1e-12)


def test_pg_and_m2po_weigh_each_token_hand_values():
    inp = lambda: _inputs([[-1.0, -2.0]], [[-1.0, -2.0]], [-2.0], [0], [[0.5, 2.0]])  # noqa: E731
    loss, grad = _loss_and_grad("pg", inp())  # seq_mean of -w A: (1 + 4) / 2
    assert loss == pytest.approx(2.5, abs=1e-12) and grad == pytest.approx([0.5, 2.0], abs=1e-12)
    loss, grad = _loss_and_grad("m2po", inp())  # token sum / tokens: (1 + 4) / 2, nothing masked on-policy
    assert loss == pytest.approx(2.5, abs=1e-12) and grad == pytest.approx([0.5, 2.0], abs=1e-12)


@pytest.mark.parametrize("name,options", [("gspo", {}), ("gepo", {})])
def test_sequence_level_losses_weigh_each_sequence_by_its_tokens_geometric_mean(name, options):
    # weights 1 and 4: geometric mean 2; on-policy the sequence ratio is 1 (GEPO's w = q / E_hat = 1
    # for a group of one), so the loss is -2 A and each token's gradient -2 A / 2 (the ratio is
    # exp of the mean log-prob)
    loss, grad = _loss_and_grad(name, _inputs([[-1.0, -2.0]], [[-1.0, -2.0]], [1.5], [0], [[1.0, 4.0]]), **options)
    assert loss == pytest.approx(-3.0, abs=1e-12)
    assert grad == pytest.approx([-1.5, -1.5], abs=1e-12)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "gspo", "gepo", "m2po", "pg", "ftis"])
def test_no_weight_and_a_weight_of_one_are_the_same_loss_and_gradient(name):
    g = torch.Generator().manual_seed(3)
    logp = (-1 - torch.rand(4, 5, generator=g, dtype=F64)).tolist()
    old = (torch.tensor(logp, dtype=F64) + 0.3 * torch.randn(4, 5, generator=g, dtype=F64)).tolist()
    mask = [[True] * 5, [True] * 3 + [False] * 2, [True] * 4 + [False], [True] * 2 + [False] * 3]
    args = (logp, old, [1.0, -1.0, 0.5, -0.5], [0, 0, 1, 1])
    plain = _loss_and_grad(name, _inputs(*args, mask=mask))
    ones = _loss_and_grad(name, _inputs(*args, weight=[[1.0] * 5] * 4, mask=mask))
    assert ones[0] == pytest.approx(plain[0], abs=1e-12) and ones[1] == pytest.approx(plain[1], abs=1e-12)
    # a weight of 2 on every token doubles every term (the geometric mean of 2s is 2), so the loss and its gradient
    twice = _loss_and_grad(name, _inputs(*args, weight=[[2.0] * 5] * 4, mask=mask))
    assert twice[0] == pytest.approx(2 * plain[0], abs=1e-12)
    assert twice[1] == pytest.approx([2 * x for x in plain[1]], abs=1e-12) and max(map(abs, plain[1])) > 0.01


def test_the_weight_is_data_no_gradient_reaches_it():
    inp = _inputs([[-1.0, -2.0]], [[-1.1, -2.2]], [1.0], [0])
    inp.rollout_log_weight = torch.tensor([[0.5, 2.0]], dtype=F64).log().requires_grad_()
    get_algorithm("grpo").loss(inp, get_algorithm("grpo").make_config()).loss.backward()
    assert inp.rollout_log_weight.grad is None and inp.logp.grad is not None


def test_a_weight_of_the_wrong_shape_is_refused():
    with pytest.raises(ValueError, match="rollout_log_weight"):
        _inputs([[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], [0], [[1.0]])


# ---- from the recomputation to the batch -------------------------------------------------------

def _comp(ids, lps):
    return Completion(ids, "", lps, "stop")


def test_the_recomputation_keeps_the_claims_beside_the_learners_log_probs():
    g = ScoredGroup("p", [5], [_comp([7, 8], [-1.0, -2.0]), _comp([9], [-3.0])], [1.0, 0.0], "m", 0)
    mine = with_logprobs(g, [[-1.5, -1.0], [-2.0]])
    assert [c.logprobs for c in mine.completions] == [[-1.5, -1.0], [-2.0]]
    assert mine.claimed_logprobs == [[-1.0, -2.0], [-3.0]]
    assert g.claimed_logprobs is None and g.completions[0].logprobs == [-1.0, -2.0]  # the original is untouched


def test_build_batch_puts_log_ours_over_claimed_at_each_token_and_zero_where_nothing_was_recomputed():
    claimed = ScoredGroup("a", [5, 6], [_comp([7, 1], [-1.0, -2.0]), _comp([8], [-3.0])], [1.0, 0.0], "m", 0)
    recomputed = with_logprobs(claimed, [[-1.5, -1.0], [-2.0]])
    as_claimed = ScoredGroup("b", [5], [_comp([9, 9, 1], [-1.0, -2.0, -3.0]), _comp([1], [-0.5])], [1.0, 0.0], "m", 0)
    assert build_batch([claimed, as_claimed], True, 0).rollout_log_weight is None  # nothing recomputed: no weight
    b = build_batch([recomputed, as_claimed], True, 0)
    m = b.packed.completion_mask
    assert b.rollout_log_weight.shape == b.old_logp.shape
    assert b.rollout_log_weight[0][m[0]].tolist() == pytest.approx([-0.5, 1.0])  # ours - claimed
    assert b.rollout_log_weight[1][m[1]].tolist() == pytest.approx([1.0])
    assert b.rollout_log_weight[2:].abs().sum() == 0  # the claims' group: weight 1
    assert b.rollout_log_weight[~m].abs().sum() == 0


def test_the_weight_is_truncated_to_within_a_factor_of_the_cap_either_way():
    b = build_batch([with_logprobs(ScoredGroup("a", [5], [_comp([7, 8, 9], [-2.0, -1.0, -1.0]), _comp([7], [-1.0])],
                                               [1.0, 0.0], "m", 0), [[-2.0 + math.log(3), -1.0 + math.log(0.25), -1.0],
                                                                      [-1.0]])], True, 0)
    rows, m = torch.tensor([0, 1]), b.packed.completion_mask
    log_w, stats = rollout_weight(b, rows, rows, b.old_logp.shape[1], 2.0, m)
    assert log_w[0][m[0]].exp().tolist() == pytest.approx([2.0, 0.5, 1.0])  # 3 truncated to 2, 0.25 to 1/2
    assert rollout_weight(b, rows, rows, b.old_logp.shape[1], None, m) == (None, {})  # off
    assert stats == rollout_stats(b.rollout_log_weight, m, 2.0)
    # per sequence, then over sequences: (2 + 0.5 + 1) / 3 and 1; 2/3 and 0
    assert stats["rollout_weight_mean"] == pytest.approx((3.5 / 3 + 1.0) / 2)
    assert stats["rollout_truncated_frac"] == pytest.approx((2 / 3 + 0) / 2)


def test_a_cap_below_one_or_infinite_is_refused():
    for bad in (0.5, math.inf):  # inf: exp of a long sequence's gap could overflow
        with pytest.raises(ValueError, match="1 <= rollout_is_cap < inf"):
            LearnerConfig(behaviour=BehaviourConfig(rollout_is_cap=bad))
    assert LearnerConfig(behaviour=BehaviourConfig(rollout_is_cap=0)).behaviour.rollout_is_cap == 0  # off
