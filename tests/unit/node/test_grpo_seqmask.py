"""GRPO with a sequence-level drift mask (node/algorithms/grpo_seqmask.py): the mask by hand at each
length scaling, the loss and its gradient by hand, GRPO exactly on-policy, micro-batches."""

import math

import pytest
import torch

from node.algorithms import get_algorithm
from node.algorithms.base import DRIFT_LOG, BatchShape
from node.algorithms.grpo import GRPOConfig, grpo_loss
from node.algorithms.grpo_seqmask import GRPOSeqMaskConfig, grpo_seqmask_loss, seq_drift_keep

from helpers.losses import JUNK, inputs

D = math.log(1.2)  # the default delta: 0.18232


def case():
    # per-token log ratios d = l^p - l^q (l^q = -1 everywhere), delta = ln 1.2 = 0.18232, bound delta sqrt(n):
    #   row 0, A = +1, n = 4: d = +.3 -.3 +.1 -.1   D = 0    <= 0.3646  kept   (noise; GRPO clips its first token)
    #   row 1, A = -1, n = 4: d = .1 each           D = 0.4  >  0.3646  masked (a coherent drift inside the clip)
    #   row 2, A = -1, n = 1: d = .15               D = 0.15 <= 0.1823  kept
    #   row 3, A = +1, n = 1: d = -.2               |D| = 0.2 > 0.1823  masked
    lq = -1.0
    return inputs(
        logp=[[lq + 0.3, lq - 0.3, lq + 0.1, lq - 0.1], [lq + 0.1] * 4, [lq + 0.15, JUNK, JUNK, JUNK],
              [lq - 0.2, JUNK, JUNK, JUNK]],
        old_logp=[[lq] * 4, [lq] * 4, [lq, 5.0, 5.0, 5.0], [lq, 0.0, 0.0, 0.0]],
        mask=[[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]],
        adv=[1.0, -1.0, -1.0, 1.0], groups=[0, 0, 1, 1],
    )


def test_the_mask_bounds_the_sequence_log_ratio_by_length_hand_values():
    inp = case()
    assert seq_drift_keep(inp, D, 0.5).tolist() == [True, False, True, False]
    # k = 1 (geometric mean): bounds delta n = 0.729 and 0.182: row 1's 0.4 passes, row 3's 0.2 does not
    assert seq_drift_keep(inp, D, 1.0).tolist() == [True, True, True, False]
    # k = 0 (constant 0.182 on |log rho(y)|): a 4-token sequence of noise that does not cancel,
    # d = .1 .1 .1 -.05 -> D = 0.25, is masked by it and kept under delta sqrt(4) = 0.365
    noisy = inputs(logp=[[-0.9, -0.9, -0.9, -1.05]], old_logp=[[-1.0] * 4], mask=[[1] * 4], adv=[1.0], groups=[0])
    assert seq_drift_keep(noisy, D, 0.0).tolist() == [False] and seq_drift_keep(noisy, D, 0.5).tolist() == [True]
    # an empty completion is kept (it weighs nothing either way)
    empty = inputs(logp=[[JUNK]], old_logp=[[0.0]], mask=[[0]], adv=[1.0], groups=[0])
    assert seq_drift_keep(empty, D, 0.5).tolist() == [True]


def test_masked_sequences_drop_out_hand_values_and_gradients():
    inp = case()
    out = grpo_seqmask_loss(inp, GRPOSeqMaskConfig())
    # kept rows' GRPO terms (clip [0.8, 1.2]):
    #   row 0 (A = +1): -min(r, clip r) per token: r = e^.3 = 1.3499 -> -1.2 (clipped); e^-.3 = 0.7408 ->
    #   -0.7408 (r < 0.8 with A > 0: the unclipped branch is the min); e^.1 -> -1.1052; e^-.1 -> -0.9048
    #   mean over its 4 tokens: -(1.2 + 0.7408 + 1.1052 + 0.9048) / 4 = -0.98771
    #   row 2 (A = -1): r = e^.15 = 1.1618 inside the clip -> +1.1618
    # masked rows 1 and 3 add 0 but still count in B = 4: (-0.98771 + 1.16183) / 4 = 0.04353
    row0 = -(1.2 + math.exp(-0.3) + math.exp(0.1) + math.exp(-0.1)) / 4
    assert out.loss.item() == pytest.approx((row0 + math.exp(0.15)) / 4, rel=1e-12)
    assert out.metrics["masked_frac"] == 0.5
    # GRPO's diagnostics over every real token, masked ones included: one clipped token of 10
    assert out.metrics["clip_frac"] == pytest.approx(0.1)
    out.loss.backward()
    g = inp.logp.grad
    # d/dl^p of -r A / (n B): row 0's clipped token 0; the others -r / 16; row 2: +r / 4; masked rows: 0
    assert g[0].tolist() == pytest.approx([0.0, -math.exp(-0.3) / 16, -math.exp(0.1) / 16, -math.exp(-0.1) / 16],
                                          rel=1e-12)
    assert g[2, 0].item() == pytest.approx(math.exp(0.15) / 4, rel=1e-12)
    assert (g[1] == 0).all() and (g[3] == 0).all() and (g[2, 1:] == 0).all()
    # plain GRPO pushes both masked rows (row 1 down at 4 x e^.1 / 16, row 3 up at e^-.2 / 4)
    plain = case()
    grpo_loss(plain, GRPOConfig()).loss.backward()
    assert plain.logp.grad[1].tolist() == pytest.approx([math.exp(0.1) / 16] * 4, rel=1e-12)
    assert plain.logp.grad[3, 0].item() == pytest.approx(-math.exp(-0.2) / 4, rel=1e-12)


def _random_case(seed: int, on_policy: bool, **kw):
    gen = torch.Generator().manual_seed(seed)
    lq = -torch.rand(6, 5, generator=gen, dtype=torch.float64) * 3
    lp = lq.clone() if on_policy else lq + 0.4 * torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1] * 5, [1] * 3 + [0] * 2, [1] * 4 + [0], [1] + [0] * 4, [1] * 5, [0] * 5], dtype=torch.bool)
    adv = torch.randn(6, generator=gen, dtype=torch.float64)
    return inputs(lp.tolist(), lq.tolist(), mask.tolist(), adv.tolist(), [0, 0, 0, 1, 1, 1], **kw)


@pytest.mark.parametrize("options", [
    {}, {"aggregation": "token_mean"}, {"aggregation": "dr_grpo"}, {"beta": 0.005, "dual_clip": math.inf},
    {"dual_truncate": True, "eps_high": 0.28}, {"normalize_std": False, "delta": 1e-9, "length_power": 1.0}])
def test_on_policy_it_is_grpo_exactly_in_float64(options):
    """p = q: every sequence is kept (D = 0, even at a bound of 1e-9), and the loss and gradient are
    GRPO's to the bit, for every GRPO option (a rollout weight included)."""
    grpo_options = {k: v for k, v in options.items() if k not in ("delta", "length_power")}
    rollout = torch.linspace(-0.5, 0.5, 30, dtype=torch.float64).reshape(6, 5)
    a, b = (_random_case(0, True, rollout_log_weight=rollout) for _ in range(2))
    masked, plain = grpo_seqmask_loss(a, GRPOSeqMaskConfig(**options)), grpo_loss(b, GRPOConfig(**grpo_options))
    masked.loss.backward()
    plain.loss.backward()
    assert masked.loss.item() == plain.loss.item(), (masked.loss.item(), plain.loss.item())
    assert torch.equal(a.logp.grad, b.logp.grad), (a.logp.grad - b.logp.grad).abs().max()
    assert masked.metrics["masked_frac"] == 0
    assert {k: v for k, v in masked.metrics.items() if k != "masked_frac"} == plain.metrics


def test_micro_batches_sum_to_the_whole_batch():
    """The mask is each row's own, so rows split into micro-batches (with the whole batch's shape)
    give losses and gradients that sum to the whole batch's."""
    cfg = GRPOSeqMaskConfig()
    whole = _random_case(1, False)
    out = grpo_seqmask_loss(whole, cfg)
    out.loss.backward()
    assert 0 < out.metrics["masked_frac"] < 1  # the case masks some rows, not all
    shape = BatchShape.of(whole.mask)
    total, grads = 0.0, []
    for rows in (slice(0, 2), slice(2, 6)):
        part = inputs(whole.logp.detach()[rows].tolist(), whole.old_logp[rows].tolist(), whole.mask[rows].tolist(),
                      whole.advantages[rows].tolist(), whole.group_ids[rows].tolist(), whole=shape)
        piece = grpo_seqmask_loss(part, cfg).loss
        piece.backward()
        total += piece.item()
        grads.append(part.logp.grad)
    assert total == pytest.approx(out.loss.item(), rel=1e-12, abs=1e-15)
    assert torch.allclose(torch.cat(grads), whole.logp.grad, rtol=1e-12, atol=1e-15)


def test_a_forged_claim_moves_a_token_by_at_most_c_times_its_advantage():
    """Whatever q a sampler claims, a kept token weighs at most max(1 + eps_high, c) |A| (GRPO's
    bound), and a claim far from p masks its sequence outright."""
    for log_r in torch.linspace(-8, 8, 33).tolist():
        for adv in (1.0, -1.0, -2.5):
            inp = inputs(logp=[[-1.0]], old_logp=[[-1.0 - log_r]], mask=[[1]], adv=[adv], groups=[0])
            out = grpo_seqmask_loss(inp, GRPOSeqMaskConfig())
            out.loss.backward()
            assert abs(inp.logp.grad.item()) <= 3 * abs(adv) * (1 + 1e-9), (log_r, adv)
            assert out.metrics["masked_frac"] == (abs(log_r) > DRIFT_LOG), log_r


def test_config_checks_and_registry():
    algo = get_algorithm("grpo_seqmask")
    cfg = algo.make_config({"delta": 0.5, "eps_high": 0.28})
    assert (cfg.delta, cfg.length_power, cfg.eps_high, cfg.aggregation) == (0.5, 0.5, 0.28, "seq_mean")
    for bad in ({"delta": 0.0}, {"length_power": 1.5}, {"length_power": -0.1}, {"beta": -1.0}):
        with pytest.raises(ValueError):
            algo.make_config(bad)
