"""The policy losses pinned to hand-computed values, gradients, stop-gradients and edge cases."""

import math
from dataclasses import asdict

import pytest
import torch

from node.algorithms import get_algorithm, group_advantages
from node.algorithms.base import BatchShape, LossInputs, aggregate, group_logsumexp
from node.algorithms.ftis import FTISConfig, ftis_loss
from node.algorithms.gepo import GEPOConfig, gepo_loss
from node.algorithms.grpo import GRPOConfig, grpo_loss
from node.algorithms.gspo import GSPOConfig, gspo_loss

from helpers.losses import JUNK, inputs

ln = math.log


# ---- advantages -------------------------------------------------------------------------------

def test_group_advantages_hand_values_and_zero_variance_groups():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5])
    groups = torch.tensor([7, 7, 7, 7, 3, 3, 9])  # ids need not be contiguous; sizes differ
    adv, zero = group_advantages(rewards, groups, normalize_std=True)
    s = 0.5 / math.sqrt(1 / 3)  # centred 0.5 over unbiased std sqrt(1/3)
    assert adv.tolist() == pytest.approx([s, -s, -s, s, 0, 0, 0], abs=1e-5)
    assert zero.tolist() == [False] * 4 + [True] * 3  # all-equal group and singleton group
    adv_raw, _ = group_advantages(rewards, groups, normalize_std=False)
    assert adv_raw.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0])


# ---- GRPO / Dr. GRPO ----------------------------------------------------------------------------

def grpo_case():
    # row 0: two tokens, ratios 2 and 1, A = +1; row 1: one token, ratio 1.6, A = -1
    return inputs(
        logp=[[ln(0.5), ln(0.25), JUNK], [ln(0.8), JUNK, JUNK]],
        old_logp=[[ln(0.25), ln(0.25), 3.0], [ln(0.5), 7.0, JUNK]],
        mask=[[1, 1, 0], [1, 0, 0]], adv=[1.0, -1.0], groups=[0, 0],
    )


def test_grpo_hand_values_each_aggregation():
    # per-token losses: row0 [-min(2, 1.2), -min(1, 1)] = [-1.2, -1]; row1 -min(-1.6, -1.2) = 1.6
    for agg, expected in [("seq_mean", (-1.1 + 1.6) / 2), ("token_mean", (-1.2 - 1 + 1.6) / 3),
                          ("dr_grpo", (-1.2 - 1 + 1.6) / (2 * 2))]:  # constant: B x the longest completion
        out = grpo_loss(grpo_case(), GRPOConfig(aggregation=agg))
        assert out.loss.item() == pytest.approx(expected), agg
    out = grpo_loss(grpo_case(), GRPOConfig())
    assert out.metrics["clip_frac"] == pytest.approx(1 / 3)  # only row0's first token is clipped
    assert out.metrics["is_weight_mean"] == pytest.approx((2 + 1 + 1.6) / 3)


def test_grpo_asymmetric_clip_and_dr_grpo_preset():
    out = grpo_loss(grpo_case(), GRPOConfig(eps_high=0.28))
    assert out.loss.item() == pytest.approx((-(1.28 + 1) / 2 + 1.6) / 2)
    dr = get_algorithm("dr_grpo")
    cfg = dr.make_config()
    assert cfg.aggregation == "dr_grpo" and cfg.normalize_std is False
    assert dr.loss(grpo_case(), cfg).loss.item() == pytest.approx(-0.6 / 4)


def test_grpo_gradient_direction_and_stop_gradient():
    inp = grpo_case()
    inp.old_logp.requires_grad_(True)
    grpo_loss(inp, GRPOConfig()).loss.backward()
    g = inp.logp.grad
    # row0 token0 clipped -> no gradient; token1 unclipped, A>0 -> loss falls as logp rises
    assert g[0, 0] == 0 and g[0, 1] == pytest.approx(-1 * 1 / 2 / 2)
    # row1 A<0 unclipped (ratio 1.6 on the pessimistic side): d/dlogp = +ratio*|A|/B
    assert g[1, 0] == pytest.approx(1.6 / 2)
    assert (g[:, 2] == 0).all() and g[1, 1] == 0  # padding gets nothing
    # the behaviour log-probs are data (sg(l^q)): a loss that let the gradient reach them
    # would give them -dL/dl^p here
    assert inp.old_logp.grad is None or (inp.old_logp.grad == 0).all()


def test_grpo_kl_to_the_sampler_hand_values_and_gradient():
    # k3(d) = e^d - d - 1 of d = l^q - l^p: row0 token0 d = ln(1/2) -> 0.5 + ln 2 - 1, token1 0;
    # row1 d = ln(0.625) -> 0.625 - ln(0.625) - 1; seq_mean then mean over the 2 rows
    kl = ((0.5 + math.log(2) - 1) / 2 + (0.625 - math.log(0.625) - 1)) / 2
    plain = grpo_loss(grpo_case(), GRPOConfig()).loss.item()
    inp = grpo_case()
    out = grpo_loss(inp, GRPOConfig(beta=0.5))
    assert out.loss.item() == pytest.approx(plain + 0.5 * kl)
    out.loss.backward()
    # d k3 / d l^p = 1 - e^d: row1 (one token of 2 rows) gains 0.5 (1 - 0.625) / 2 on its PPO term's 1.6 / 2
    assert inp.logp.grad[1, 0] == pytest.approx(1.6 / 2 + 0.5 * (1 - 0.625) / 2)
    with pytest.raises(ValueError):
        GRPOConfig(beta=-1.0)


# ---- GSPO ------------------------------------------------------------------------------------------

def test_gspo_sequence_ratio_and_tiny_clip():
    out = gspo_loss(grpo_case(), GSPOConfig())
    s0 = math.exp((ln(2) + 0) / 2)  # sqrt(2) -> clipped at 1 + 4e-4 for A > 0
    assert out.metrics["is_weight_mean"] == pytest.approx((s0 + 1.6) / 2)
    # row1: A<0, s = 1.6: min(-1.6, -(1 + 4e-4)) = -1.6 -> loss 1.6 (unclipped, pessimistic)
    assert out.loss.item() == pytest.approx((-(1 + 4e-4) + 1.6) / 2)
    assert out.metrics["clip_frac"] == pytest.approx(0.5)
    inp = grpo_case()
    inp.old_logp.requires_grad_(True)
    gspo_loss(inp, GSPOConfig()).loss.backward()
    # row0 clipped (A > 0): nothing; row1: d(s |A|)/dl^p = s / 1 token, over B = 2
    assert inp.logp.grad[0].tolist() == [0, 0, 0] and inp.logp.grad[1, 0].item() == pytest.approx(1.6 / 2)
    assert inp.old_logp.grad is None or (inp.old_logp.grad == 0).all()  # sg(l^q)


# ---- GEPO ------------------------------------------------------------------------------------------

def gepo_case():
    # group 0: three completions; the first has two tokens (length normalisation matters)
    #   q = [0.5, 0.25, 0.25] -> E_hat = (0.25 + 0.0625 + 0.0625) / 1.0 = 0.375
    #   p = [0.4, 0.33, 0.27] -> w = [1.0667, 0.88, 0.72]
    # group 1: two completions, q = [0.5, 0.5] -> E_hat = 0.5; p = [0.55, 0.3] -> w = [1.1, 0.6]
    return inputs(
        logp=[[ln(0.4), ln(0.4)], [ln(0.33), JUNK], [ln(0.27), JUNK], [ln(0.55), JUNK], [ln(0.3), JUNK]],
        old_logp=[[ln(0.5), ln(0.5)], [ln(0.25), 0.0], [ln(0.25), 0.0], [ln(0.5), 0.0], [ln(0.5), 0.0]],
        mask=[[1, 1], [1, 0], [1, 0], [1, 0], [1, 0]],
        adv=[2 / 3, -1 / 3, -1 / 3, 0.5, -0.5], groups=[0, 0, 0, 1, 1],
    )


def test_gepo_group_expectation_hand_values():
    out = gepo_loss(gepo_case(), GEPOConfig())
    w = [0.4 / 0.375, 0.88, 0.72, 1.1, 0.6]
    assert out.metrics["is_weight_mean"] == pytest.approx(sum(w) / 5)
    terms = [
        -min(w[0] * 2 / 3, 1.2 * 2 / 3),  # 1.0667 inside the clip
        -min(w[1] * -1 / 3, w[1] * -1 / 3),  # 0.88 inside
        -min(w[2] * -1 / 3, 0.8 * -1 / 3),  # 0.72 < 1 - eps with A < 0: the clipped branch wins
        -min(w[3] * 0.5, w[3] * 0.5),
        -min(w[4] * -0.5, 0.8 * -0.5),  # clipped
    ]
    assert out.loss.item() == pytest.approx(sum(terms) / 5)
    assert out.metrics["clip_frac"] == pytest.approx(2 / 5)


def test_gepo_expectation_is_over_the_prompt_group_only():
    base = gepo_loss(gepo_case(), GEPOConfig()).metrics
    # moving group 1's q values changes nothing in group 0's weights
    inp = gepo_case()
    inp.old_logp[3:, 0] = ln(0.1)
    lw = torch.log(torch.tensor([0.4 / 0.375, 0.88, 0.72], dtype=torch.float64))
    from node.algorithms.gepo import gepo_log_weights
    got = gepo_log_weights(inp.logp, inp.old_logp, inp.mask, inp.group_ids)
    assert got[:3].tolist() == pytest.approx(lw.tolist())
    assert got[3:].tolist() == pytest.approx([ln(0.55 / 0.1), ln(0.3 / 0.1)])
    assert base["is_weight_mean"] != pytest.approx(gepo_loss(inp, GEPOConfig()).metrics["is_weight_mean"])


def test_gepo_gradients_and_stop_gradient_on_behaviour():
    inp = gepo_case()
    inp.old_logp.requires_grad_(True)
    gepo_loss(inp, GEPOConfig(beta=0.005)).loss.backward()
    assert inp.old_logp.grad is None or (inp.old_logp.grad == 0).all()  # sg on every q
    g = inp.logp.grad
    # A>0, unclipped, two tokens: d/dlp_t of -w A / 5 with w = exp(mean lp) / E_hat -> -w A / 10
    # plus beta * d k3 / d lp = beta * (1 - exp(lq - lp)) / 2 / 5
    kl_grad = 0.005 * (1 - 0.5 / 0.4) / 2 / 5
    assert g[0, 0].item() == pytest.approx(-(0.4 / 0.375) * (2 / 3) / 10 + kl_grad)
    assert g[1, 0] > 0 and g[4, 0] == pytest.approx(0.005 * (1 - 0.5 / 0.3) / 5)  # A<0 pushes p down; clipped row gets only KL
    assert (g[1:, 1] == 0).all()


def test_gepo_kl_term_hand_value():
    off = gepo_loss(gepo_case(), GEPOConfig()).loss.item()
    on = gepo_loss(gepo_case(), GEPOConfig(beta=0.5)).loss.item()
    k3 = lambda q, p: q / p - ln(q / p) - 1  # noqa: E731
    kl = [k3(0.5, 0.4), k3(0.25, 0.33), k3(0.25, 0.27), k3(0.5, 0.55), k3(0.5, 0.3)]
    assert on - off == pytest.approx(0.5 * sum(kl) / 5)


def test_gepo_logs_the_unbounded_k3_like_every_other_loss():
    # one token with q/p = e^2 > c = 3: the loss term caps its log-ratio at log 3, the diagnostic
    # does not (so kl_k3 means the same number for every loss: mean_t k3(l^q - l^p), then mean_i)
    inp = inputs(logp=[[-3.0, -1.0]], old_logp=[[-1.0, -1.0]], mask=[[1, 1]], adv=[1.0], groups=[0])
    out = gepo_loss(inp, GEPOConfig(beta=0.1))
    assert out.metrics["kl_k3"] == pytest.approx((math.exp(2) - 2 - 1) / 2)


def test_gepo_decoupled_weight_is_a_truncated_coefficient_hand_values():
    inp = gepo_case()
    out = gepo_loss(inp, GEPOConfig(decoupled=True))
    w = [0.4 / 0.375, 0.88, 0.72, 1.1, 0.6]
    adv = [2 / 3, -1 / 3, -1 / 3, 0.5, -0.5]
    assert out.loss.item() == pytest.approx(-sum(a * b for a, b in zip(w, adv)) / 5)  # no clip: every row counts
    assert out.metrics["clip_frac"] == 0
    out.loss.backward()
    g = inp.logp.grad
    # d/dlp_t of -sg(w) A mean_t lp / 5: -w A / (tokens * 5), the weight a constant (no w in its own gradient)
    assert g[0].tolist() == pytest.approx([-w[0] * adv[0] / 10] * 2)
    assert g[4, 0].item() == pytest.approx(-w[4] * adv[4] / 5)  # plain GEPO's clip gave this row nothing
    # past c the coefficient is c: a group claimed far less likely than p (w = 0.9 / 1e-6) weighs 3 |A|, no more
    far = inputs(logp=[[ln(0.9)], [ln(0.9)]], old_logp=[[ln(1e-6)], [ln(1e-6)]], mask=[[1], [1]], adv=[1.0, -1.0],
                 groups=[0, 0])
    out = gepo_loss(far, GEPOConfig(decoupled=True))
    out.loss.backward()
    assert far.logp.grad[:, 0].tolist() == pytest.approx([-3.0 / 2, 3.0 / 2]) and out.metrics["clip_frac"] == 1


def test_gepo_len_clip_is_centred_on_the_group_factor_and_narrowed_by_length_hand_values():
    inp = gepo_case()
    out = gepo_loss(inp, GEPOConfig(len_clip=True))
    # g = q / E_hat = [4/3, 2/3, 2/3 | 1, 1]; w = [1.0667, 0.88, 0.72 | 1.1, 0.6]; half-width log(1.2) / sqrt(n)
    w, adv = [0.4 / 0.375, 0.88, 0.72, 1.1, 0.6], [2 / 3, -1 / 3, -1 / 3, 0.5, -0.5]
    lo4 = 1 / 1.2  # row 4: g = 1, n = 1
    terms = [
        -w[0] * adv[0],  # below its range [4/3 / 1.2^(1/sqrt 2), ...] with A > 0: the unclipped branch
        -w[1] * adv[1],  # range [0.556, 0.8]: above it with A < 0, unclipped
        -w[2] * adv[2],  # inside: plain GEPO clipped this row (0.72 < 0.8 around 1)
        -w[3] * adv[3],
        -lo4 * adv[4],  # 0.6 < 0.833 with A < 0: clipped
    ]
    assert out.loss.item() == pytest.approx(sum(terms) / 5)
    assert out.metrics["clip_frac"] == pytest.approx(1 / 5)
    out.loss.backward()
    assert inp.logp.grad[0].tolist() == pytest.approx([-w[0] * adv[0] / 10] * 2) and inp.logp.grad[4, 0] == 0
    # on-policy nothing is clipped, where plain GEPO's clip around 1 cuts the rows whose g is far from 1
    on = gepo_case()
    on.logp = on.old_logp.clone().requires_grad_(True)
    assert gepo_loss(on, GEPOConfig(len_clip=True)).metrics["clip_frac"] == 0
    assert gepo_loss(on, GEPOConfig()).metrics["clip_frac"] > 0
    # a sequence of 4 tokens that drifted 0.1 nats each: inside GEPO's 0.18, outside log(1.2) / 2 = 0.09
    long = inputs(logp=[[-0.9] * 4, [-1.0] * 4], old_logp=[[-1.0] * 4] * 2, mask=[[1] * 4] * 2, adv=[1.0, -1.0],
                  groups=[0, 0])
    assert gepo_loss(long, GEPOConfig()).metrics["clip_frac"] == 0
    assert gepo_loss(long, GEPOConfig(len_clip=True)).metrics["clip_frac"] == 0.5
    # bounded influence, whatever q is claimed: at most c |A| on a token
    for log_r in torch.linspace(-8, 8, 33).tolist():
        for a in (1.0, -1.0):
            one = inputs(logp=[[-1.0]], old_logp=[[-1.0 - log_r]], mask=[[1]], adv=[a], groups=[0])
            gepo_loss(one, GEPOConfig(len_clip=True)).loss.backward()
            assert abs(one.logp.grad.item()) <= 3 * (1 + 1e-9)
    with pytest.raises(ValueError, match="choose one"):
        GEPOConfig(len_clip=True, decoupled=True)


def test_gepo_lenclip_is_gepo_with_len_clip_and_the_learners_default():
    from node.learner import LearnerConfig

    algo = get_algorithm("gepo_lenclip")
    assert algo.loss is gepo_loss and asdict(algo.make_config()) == asdict(GEPOConfig(len_clip=True))
    assert algo.make_config({"eps": 0.1}).len_clip  # options still apply on top of the preset
    with pytest.raises(ValueError, match="choose one"):
        algo.make_config({"decoupled": True})
    assert LearnerConfig().own_loss == "gepo_lenclip"
    # a config that names GRPO with GRPO's own options loads: the default carries no GEPO-only field
    assert LearnerConfig(own_loss="grpo", own_options={"eps_low": 0.2, "eps_high": 0.28}).own_loss == "grpo"


def test_theorem1_group_expectation_weights_have_far_lower_variance(capsys):
    """GEPO's Theorem 1, numerically: Var[p/E_hat] falls far below Var[p/q] as KL(p||q) grows."""
    from examples.gepo_variance import format_table, variance_table

    near, mid, far = variance_table(deltas=(0.5, 2.0, 4.0), pairs=16, samples=8_000, seed=0)
    with capsys.disabled():
        print("\n" + format_table([near, mid, far]))
    assert near["kl"] < 0.3 < 1 < mid["kl"] < 3 < far["kl"]
    assert near["ratio"] < 1  # honest: near on-policy, plain IS has the lower variance
    assert mid["ratio"] > 5 and mid["gepo_wins"] >= 0.9
    assert far["ratio"] > 50 and far["gepo_wins"] >= 0.9


# ---- M2PO ------------------------------------------------------------------------------------------

def test_m2po_masks_the_largest_squared_log_ratios_until_the_mean_is_under_tau():
    from node.algorithms.m2po import m2po_mask

    # four A > 0 tokens: log ratios 0.1, 0.5, 0.3, -0.4 (the last is not a candidate: r < 1, A > 0)
    l = torch.tensor([[0.1, 0.5, 0.3, -0.4]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    # candidates' squares .01, .25, .09: mean .117 > .05; ascending prefix means .01, .05, .117 -> keep 2
    assert m2po_mask(l, torch.tensor([1.0]), mask, 0.05).tolist() == [[True, False, True, True]]
    assert m2po_mask(l, torch.tensor([1.0]), mask, 0.2).all()  # mean .117 <= .2: nothing goes
    # A < 0: the candidates are the r < 1 tokens; the r > 1 ones stay whatever their size
    assert m2po_mask(l, torch.tensor([-1.0]), mask, 0.1).tolist() == [[True, True, True, False]]


def test_m2po_hand_values_and_gradients():
    from node.algorithms.m2po import M2POConfig, m2po_loss

    # grpo_case: row0 log r = ln 2 (candidate, square .48), 0 (not); row1 log r = ln 1.6 with A < 0 (not)
    out = m2po_loss(grpo_case(), M2POConfig(tau=0.5))  # .48 <= .5: no mask, no clip: -r A over 3 tokens
    assert out.loss.item() == pytest.approx((-2 - 1 + 1.6) / 3) and out.metrics["clip_frac"] == 0
    inp = grpo_case()
    inp.old_logp.requires_grad_(True)
    out = m2po_loss(inp, M2POConfig())  # tau .04: row0's first token goes
    assert out.loss.item() == pytest.approx((-1 + 1.6) / 3) and out.metrics["clip_frac"] == pytest.approx(1 / 3)
    out.loss.backward()
    g = inp.logp.grad  # d(-r A)/dl^p = -r A, over the 3 real tokens
    assert g[0, 0] == 0 and g[0, 1].item() == pytest.approx(-1 / 3) and g[1, 0].item() == pytest.approx(1.6 / 3)
    assert inp.old_logp.grad is None or (inp.old_logp.grad == 0).all()


def test_m2po_cap_solves_the_released_codes_budget_by_hand():
    from node.algorithms.m2po import m2po_cap

    # squares .01, .25, .09, tau .05: target .15; capping at c: .01 + 2c = .15 -> c = .07
    assert m2po_cap(torch.tensor([0.01, 0.25, 0.09]), 0.05) == pytest.approx(math.sqrt(0.07))
    assert m2po_cap(torch.tensor([1.0, 1.0]), 0.25) == pytest.approx(0.5)  # every one capped: 2c = .5
    assert m2po_cap(torch.tensor([0.01, 0.03]), 0.05) == math.inf  # mean already under tau
    assert m2po_cap(torch.tensor([]), 0.05) == math.inf


def test_m2po_cap_clips_instead_of_dropping():
    from node.algorithms.m2po import M2POConfig, m2po_loss

    # grpo_case's one candidate (log r = ln 2, A > 0): c = .04, so its ratio is clipped to e^.2
    inp = grpo_case()
    out = m2po_loss(inp, M2POConfig(bound="cap"))
    assert out.loss.item() == pytest.approx((-math.exp(0.2) - 1 + 1.6) / 3) and out.metrics["clip_frac"] == pytest.approx(1 / 3)
    out.loss.backward()
    g = inp.logp.grad  # clipped token: no gradient; the others -r A over the 3 real tokens
    assert g[0, 0] == 0 and g[0, 1].item() == pytest.approx(-1 / 3) and g[1, 0].item() == pytest.approx(1.6 / 3)
    with pytest.raises(ValueError, match="bound"):
        M2POConfig(bound="clip")


def test_m2po_without_the_dual_clip_pushes_back_on_a_punished_token_that_ran_away():
    from node.algorithms.m2po import M2POConfig, m2po_loss

    # one A = -1 token whose ratio ran away to 5 (not a candidate: r > 1 with A < 0, so never masked)
    def case():
        return inputs(logp=[[ln(0.5)]], old_logp=[[ln(0.1)]], mask=[[1]], adv=[-1.0], groups=[0])
    capped = case()
    out = m2po_loss(capped, M2POConfig())  # ours: -r A = 5 capped at c |A| = 3, so no gradient
    out.loss.backward()
    assert out.loss.item() == pytest.approx(3.0) and capped.logp.grad.item() == 0
    free = case()
    out = m2po_loss(free, M2POConfig(dual_clip=math.inf))  # the released code's: -r A = 5, d/dl^p = -r A = 5
    out.loss.backward()
    assert out.loss.item() == pytest.approx(5.0) and free.logp.grad.item() == pytest.approx(5.0)


# ---- F-TIS -----------------------------------------------------------------------------------------

def ftis_case(gap_neg_far=5.0):
    # row0: A>0, tokens with p/g = 3 (truncated to C = 2) and 0.5
    # row1: A<0, foreign model far off (l^g - l^p = 5 per token -> k3 = e^5 - 6 = 142 > 50): filtered
    # row2: A<0, close (p/g = 1.5): kept
    # row3: A>0, as far off as row1: kept (the gate only drops negative advantages)
    return inputs(
        logp=[[ln(0.6), ln(0.1)], [ln(0.01), ln(0.01)], [ln(0.3), JUNK], [ln(0.01), JUNK]],
        old_logp=[[ln(0.2), ln(0.2)], [ln(0.01) + gap_neg_far] * 2, [ln(0.2), 0.0], [ln(0.01) + gap_neg_far, 0.0]],
        mask=[[1, 1], [1, 1], [1, 0], [1, 0]], adv=[1.0, -1.0, -0.5, 0.5], groups=[0, 0, 0, 0],
    )


def test_ftis_cap_gate_and_hand_values():
    inp = ftis_case()
    out = ftis_loss(inp, FTISConfig())
    # R = 1 in value, so per token -w A'; row1 filtered to A' = 0
    row0 = -(2.0 * 1 + 0.5 * 1) / 2
    row2 = -(1.5 * -0.5)
    row3 = -(math.exp(-5) * 0.5)
    assert out.loss.item() == pytest.approx((row0 + 0 + row2 + row3) / 4)
    assert out.metrics["filtered_frac"] == pytest.approx(0.25)
    assert out.metrics["truncated_frac"] == pytest.approx(1 / 6)  # one of six real tokens
    out.loss.backward()
    g = inp.logp.grad
    assert (g[1] == 0).all()  # filtered: no push at all
    assert g[0, 0].item() == pytest.approx(-2.0 / 2 / 4)  # truncated weight is C, gradient sign up
    assert g[2, 0] > 0 and g[3, 0] < 0


def test_ftis_weight_is_stop_gradient():
    inp = ftis_case()
    # with sg(w) the gradient is -w A / (n_tokens B); without it there would be an extra w' term
    ftis_loss(inp, FTISConfig(cap=100.0)).loss.backward()
    assert inp.logp.grad[0, 1].item() == pytest.approx(-0.5 / 2 / 4)


def test_ftis_gate_threshold_and_sequence_level_mode():
    assert ftis_loss(ftis_case(gap_neg_far=3.0), FTISConfig()).metrics["filtered_frac"] == 0  # k3(3) = 16 < 20
    assert ftis_loss(ftis_case(gap_neg_far=3.0), FTISConfig(kl_threshold=10)).metrics["filtered_frac"] == 0.25
    inp = ftis_case()
    # foreign tokenizer: only g's log-prob of each whole completion is known (the sum over its own
    # tokens, however many: row 0's text is 2 learner tokens, g's numbers are per text)
    inp.old_seq_logp = torch.tensor([2 * ln(0.2), 2 * (ln(0.01) + 5), ln(0.2), ln(0.01) + 5], dtype=torch.float64)
    out = ftis_loss(inp, FTISConfig())
    # d_i = (log p(y) - log g(y)) / n_i learner tokens, one weight per row
    w0 = min(math.exp((ln(0.6) + ln(0.1) - 2 * ln(0.2)) / 2), 2.0)
    assert out.metrics["filtered_frac"] == 0.25
    assert out.loss.item() == pytest.approx((-w0 + 0 + 0.75 - math.exp(-5) * 0.5) / 4)


def test_ftis_gate_is_the_mean_of_token_k3_and_the_sequence_gate_sees_only_the_average_gap():
    k3 = lambda x: math.exp(x) - x - 1  # noqa: E731  x = l^g - l^p
    # threshold 50 here; A < 0 rows; row 0: one far token among three, mean k3 = 142.4 / 3 = 47.5 < 50:
    # kept (a max over tokens would drop it); row 1: gaps +5 and -5, mean k3 = 73.2 > 50: filtered
    inp = inputs(logp=[[-6.0, -1.0, -1.0], [-6.0, -1.0, JUNK]], old_logp=[[-1.0, -1.0, -1.0], [-1.0, -6.0, 0.0]],
                 mask=[[1, 1, 1], [1, 1, 0]], adv=[-1.0, -1.0], groups=[0, 0])
    out = ftis_loss(inp, FTISConfig(kl_threshold=50.0))
    assert out.metrics["kl_k3"] == pytest.approx((k3(5) / 3 + (k3(5) + k3(-5)) / 2) / 2)
    assert out.metrics["filtered_frac"] == 0.5
    assert (inp.logp.grad is None) and out.loss.backward() is None and (inp.logp.grad[1] == 0).all()
    assert (inp.logp.grad[0, :3] != 0).all()
    # the same texts re-tokenized: row 1's gaps cancel (d = 0), so the sequence gate keeps it
    seq = inputs(logp=[[-6.0, -1.0, -1.0], [-6.0, -1.0, JUNK]], old_logp=[[0.0] * 3] * 2,
                 mask=[[1, 1, 1], [1, 1, 0]], adv=[-1.0, -1.0], groups=[0, 0], old_seq_logp=torch.tensor([-3.0, -7.0]))
    out = ftis_loss(seq, FTISConfig(kl_threshold=50.0))
    assert out.metrics["filtered_frac"] == 0 and out.metrics["kl_k3"] == pytest.approx((k3(5 / 3) + 0) / 2)


# ---- all losses: robustness --------------------------------------------------------------------

ALL = ["grpo", "dr_grpo", "grpo_seqmask", "gspo", "gepo", "gepo_lenclip", "m2po", "tis", "ftis", "pg"]


@pytest.mark.parametrize("name", ALL)
def test_finite_for_extreme_gaps_empty_completions_and_equal_rewards(name):
    algo = get_algorithm(name)
    inp = inputs(
        logp=[[-1e4, 0.0, -1e4], [0.0, 0.0, 0.0], [-1e4, -1e4, 0.0], [-3.0, -2.0, -1.0]],
        old_logp=[[0.0, -1e4, 0.0], [-1e4, -1e4, -1e4], [0.0, 0.0, 0.0], [-1e4, 0.0, -1e4]],
        mask=[[1, 1, 1], [0, 0, 0], [1, 1, 0], [1, 1, 1]],  # row 1 is an empty completion
        adv=[1.0, -1.0, -1.0, 1.0], groups=[0, 0, 1, 1],
    )
    out = algo.loss(inp, algo.make_config({"beta": 0.005} if name.startswith("gepo") else {}))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(inp.logp.grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())
    # all-equal rewards: advantages are zero, loss is zero, nothing moves
    zero = inputs(logp=[[-1.0], [-2.0]], old_logp=[[-1.5], [-1.0]], mask=[[1], [1]], adv=[0.0, 0.0], groups=[0, 0])
    out = algo.loss(zero, algo.make_config())
    out.loss.backward()
    assert out.loss.item() == 0 and (zero.logp.grad == 0).all()


@pytest.mark.parametrize("name", ALL)
def test_on_policy_all_losses_give_the_policy_gradient_direction(name):
    """On-policy (p = q), every loss pushes the positive-advantage completion up and the negative one down."""
    algo = get_algorithm(name)
    inp = inputs(logp=[[-1.0, -2.0], [-0.5, -1.5]], old_logp=[[-1.0, -2.0], [-0.5, -1.5]],
                 mask=[[1, 1], [1, 1]], adv=[1.0, -1.0], groups=[0, 0])
    algo.loss(inp, algo.make_config()).loss.backward()
    assert (inp.logp.grad[0] < 0).all() and (inp.logp.grad[1] > 0).all()


def test_pg_ignores_behaviour_logprobs():
    a, b = grpo_case(), grpo_case()
    b.old_logp.fill_(-3.0)
    from node.algorithms.pg import PGConfig, pg_loss
    la, lb = pg_loss(a, PGConfig()), pg_loss(b, PGConfig())
    la.loss.backward()
    lb.loss.backward()
    assert torch.equal(a.logp.grad, b.logp.grad)  # bitwise: the same ops on the same log-probs
    assert a.logp.grad[0, 0].item() == pytest.approx(-1 / 2 / 2) and a.logp.grad[1, 0].item() == pytest.approx(1 / 2)


def test_registry_rejects_unknown_names_and_options_with_a_fix():
    with pytest.raises(ValueError, match="choose one of"):
        get_algorithm("ppo2")
    with pytest.raises(ValueError, match="valid:"):
        get_algorithm("gepo").make_config({"epsilon": 0.1})
    with pytest.raises(ValueError, match="aggregation"):
        get_algorithm("grpo").make_config({"aggregation": "sum"})


def test_shape_checks_and_helpers():
    with pytest.raises(ValueError, match="must all be"):
        LossInputs(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.ones(2, 3), torch.zeros(2))
    x = torch.tensor([0.0, ln(3.0), 5.0], dtype=torch.float64)  # hand values to float64 rounding, any CPU
    assert group_logsumexp(x, torch.tensor([1, 1, 4])).tolist() == pytest.approx([ln(4.0), ln(4.0), 5.0])
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), "sum", BatchShape(1, 1, 1))


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("name", ["grpo", "gspo", "gepo", "m2po"])
def test_a_forged_claim_moves_a_token_by_at_most_c_times_its_advantage(name, truncate):
    """Whatever behaviour log-prob a sampler claims, one token's gradient weight is at most
    max(1 + eps_high, c) |A| = 3 |A| (c = 3): with the dual clip's cap (no gradient past c) and
    with its truncated form (weight c past c). Only the truncated form still pushes back a token
    the policy ran away with (r = p / q past c for A < 0)."""
    algo = get_algorithm(name)
    cfg = algo.make_config({"dual_truncate": truncate})
    for log_r in torch.linspace(-8, 8, 33).tolist():
        for adv in (1.0, -1.0, -2.5):
            inp = inputs(logp=[[-1.0]], old_logp=[[-1.0 - log_r]], mask=[[1]], adv=[adv], groups=[0])
            algo.loss(inp, cfg).loss.backward()
            g = inp.logp.grad.item()
            assert abs(g) <= 3 * abs(adv) * (1 + 1e-9), (log_r, adv, g)
            if adv < 0 and log_r > math.log(3):  # a punished token that ran away past c
                assert g == (pytest.approx(3 * abs(adv)) if truncate else 0.0), (log_r, adv, g)


def test_drift_stats_hand_values():
    from node.algorithms.base import drift_stats

    logp = torch.tensor([[0.0, math.log(1.5)], [math.log(0.5), 9.0]])
    out = drift_stats(logp, torch.zeros(2, 2), torch.tensor([[1, 1], [1, 0]]), torch.tensor([1.0, -1.0]))
    # |log p/q|: 0, ln 1.5 and ln 2 over three tokens (the fourth is padding): two past ln 1.2
    assert out["drift_frac"] == pytest.approx(2 / 3)
    assert out["weight_mean_pos"] == pytest.approx((1 + 1.5) / 2) and out["weight_mean_neg"] == pytest.approx(0.5)
    none = drift_stats(logp, torch.zeros(2, 2), torch.tensor([[1, 1], [1, 0]]), torch.tensor([1.0, 0.0]))
    assert none["weight_mean_neg"] == 1.0
