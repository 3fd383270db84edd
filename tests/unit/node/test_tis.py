"""Truncated importance sampling without a clip (node/algorithms/tis.py): loss and gradient by hand,
the weight's stop-gradient and truncation, the policy gradient on-policy, bounded influence."""

import math

import pytest
import torch

from node.algorithms import get_algorithm
from node.algorithms.grpo import GRPOConfig, grpo_loss
from node.algorithms.pg import PGConfig, pg_loss
from node.algorithms.tis import TISConfig, tis_loss

from helpers.losses import JUNK, inputs

ln = math.log


def case():
    # ratios r = p / q: row 0 (A = +1): 0.6 / 0.2 = 3 and 0.1 / 0.2 = 0.5; row 1 (A = -1): 0.8 / 0.5 = 1.6;
    # row 2 (A = -0.5): 0.8 / 0.2 = 4, a claim far below p
    return inputs(
        logp=[[ln(0.6), ln(0.1)], [ln(0.8), JUNK], [ln(0.8), JUNK]],
        old_logp=[[ln(0.2), ln(0.2)], [ln(0.5), 3.0], [ln(0.2), 0.0]],
        mask=[[1, 1], [1, 0], [1, 0]], adv=[1.0, -1.0, -0.5], groups=[0, 0, 0],
    )


def test_hand_values_each_aggregation():
    # w = min(r, 2): [2, 0.5], [1.6], [2]; per-token values -w A: [-2, -0.5], [+1.6], [+1.0]
    out = tis_loss(case(), TISConfig())
    assert out.loss.item() == pytest.approx((-(2 + 0.5) / 2 + 1.6 + 1.0) / 3, rel=1e-12)  # seq_mean: 0.45
    assert tis_loss(case(), TISConfig(aggregation="token_mean")).loss.item() == pytest.approx((-2 - 0.5 + 1.6 + 1.0) / 4)
    assert out.metrics["truncated_frac"] == 0.5 and out.metrics["clip_frac"] == 0.5  # r = 3 and r = 4 of 4 tokens
    assert out.metrics["is_weight_mean"] == pytest.approx((3 + 0.5 + 1.6 + 4) / 4)  # the ratios before truncation
    # cap 1.5: w = [1.5, 0.5], [1.5], [1.5] -> (-1 + 1.5 + 0.75) / 3
    assert tis_loss(case(), TISConfig(cap=1.5)).loss.item() == pytest.approx((-(1.5 + 0.5) / 2 + 1.5 + 0.75) / 3)


def test_gradient_by_hand_with_a_stop_gradient_weight():
    inp = case()
    inp.old_logp.requires_grad_(True)
    tis_loss(inp, TISConfig()).loss.backward()
    g = inp.logp.grad
    # d/dl^p of -sg(w) R A / (n_i B), B = 3, R = 1 in value with gradient 1:
    #   row 0: -2 / 6 = -1/3 (truncated at c, still pushed) and -0.5 / 6 = -1/12 (a weight with its own
    #   gradient would give -2 r A / 6 = -1/6 there); row 1: +1.6 / 3; row 2: +2 x 0.5 / 3 = 1/3
    assert g[0].tolist() == pytest.approx([-1 / 3, -1 / 12], rel=1e-12)
    assert g[1, 0].item() == pytest.approx(1.6 / 3, rel=1e-12) and g[2, 0].item() == pytest.approx(1 / 3, rel=1e-12)
    assert g[1, 1] == 0 and g[2, 1] == 0  # padding
    assert inp.old_logp.grad is None or (inp.old_logp.grad == 0).all()  # sg(l^q)
    # GRPO gives rows 0 (token 0: clipped, A > 0) and 2 (r = 4 past the dual clip's 3, A < 0) nothing
    plain = case()
    grpo_loss(plain, GRPOConfig()).loss.backward()
    assert plain.logp.grad[0, 0] == 0 and plain.logp.grad[2, 0] == 0


def test_on_policy_the_gradient_is_the_unclipped_policy_gradient():
    # p = q: every w = 1, so d/dl^p = -A / (n_i B): row 0 (n 2): -1/6 each; row 1: +1/3; row 2: +0.5/3
    lp = [[ln(0.6), ln(0.1)], [ln(0.8), JUNK], [ln(0.8), JUNK]]
    a, b = (inputs(lp, lp, [[1, 1], [1, 0], [1, 0]], [1.0, -1.0, -0.5], [0, 0, 0]) for _ in range(2))
    out = tis_loss(a, TISConfig())
    out.loss.backward()
    assert a.logp.grad[:, 0].tolist() == pytest.approx([-1 / 6, 1 / 3, 0.5 / 3], rel=1e-12)
    assert out.metrics["truncated_frac"] == 0
    pg_loss(b, PGConfig()).loss.backward()
    assert torch.allclose(a.logp.grad, b.logp.grad, rtol=1e-12, atol=0), (a.logp.grad, b.logp.grad)


def test_a_forged_claim_moves_a_token_by_at_most_c_times_its_advantage():
    """Whatever q a sampler claims, a token's gradient weight is min(p/q, c) |A| <= c |A|, and past
    c it is exactly c |A| for either sign: no token is ever left without a gradient."""
    for log_r in torch.linspace(-8, 8, 33).tolist():
        for adv in (1.0, -1.0, -2.5):
            inp = inputs(logp=[[-1.0]], old_logp=[[-1.0 - log_r]], mask=[[1]], adv=[adv], groups=[0])
            tis_loss(inp, TISConfig()).loss.backward()
            g = inp.logp.grad.item()
            assert g == pytest.approx(-min(math.exp(log_r), 2.0) * adv, rel=1e-12), (log_r, adv, g)


def test_config_checks_and_registry():
    algo = get_algorithm("tis")
    assert algo.make_config().cap == 2.0 and algo.make_config({"cap": 4.0}).cap == 4.0
    for bad in (0.5, math.inf):
        with pytest.raises(ValueError, match="cap"):
            algo.make_config({"cap": bad})
