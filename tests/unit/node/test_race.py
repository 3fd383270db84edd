"""Checkable sampling by a seeded race (node/sampling/race.py) and its audit by margin (node/audit/margins.py):
the integer hash against a plain-Python reference, the race's distribution against softmax, the
margins by hand, the bound on an honest engine's margin, and the per-sampler flip test."""

from __future__ import annotations

import math
import random

import pytest
import torch

from node.audit.margins import FLIP_MARGIN, judge_margins, margins_at
from node.sampling.params import SamplingParams
from node.audit.flips import FlipTest, flip_llr
from node.sampling.race import (CHUNK, KEY_WORDS, audit_tokens, chunk_scores, completion_seed, hash_uniform, key_block, KEY_BLOCK, PositionKeys,
                            keys_tensor, pick_tokens, pick_with_logprobs, position_keys, race_margins, sampling_probs, tempered)
from node.sampling.filter_edges import admitted


def _lowbias32(x: int) -> int:
    """Wellons' lowbias32 in plain Python integers: the reference for the tensor version."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_the_hash_is_exact_integer_arithmetic_equal_to_a_plain_python_reference():
    rng = random.Random(0)
    words = [0, 1, 2**31 - 1, 2**31, 2**32 - 1] + [rng.getrandbits(32) for _ in range(45)]
    a = torch.tensor(words, dtype=torch.int64)[:, None]
    b = torch.tensor(words[::-1], dtype=torch.int64)[:, None]
    index = torch.tensor([0, 1, 1023, 151_935, 2**18 - 1], dtype=torch.int64)
    got = hash_uniform(a, b, index)
    want = [[(_lowbias32(_lowbias32(i ^ wa) ^ wb) + 0.5) * 2.0**-32 for i in index.tolist()]
            for wa, wb in zip(words, words[::-1])]
    assert got.tolist() == want  # bit for bit


def test_keys_are_fixed_by_the_seed_and_position_and_seeds_by_nonce_prompt_sampler_index():
    s = completion_seed(b"n" * 16, "arith:1+2", "peer", 0)
    assert len({s, completion_seed(b"m" * 16, "arith:1+2", "peer", 0), completion_seed(b"n" * 16, "arith:1+3", "peer", 0),
                completion_seed(b"n" * 16, "arith:1+2", "other", 0), completion_seed(b"n" * 16, "arith:1+2", "peer", 1)}) == 5
    keys = position_keys(s, 100)
    assert keys[5:7] == position_keys(s, 2, start=5)
    assert all(len(k) == KEY_WORDS and all(0 <= w < 2**32 for w in k) for k in keys)
    assert len({tuple(k) for k in keys}) == 100
    other = completion_seed(b"n" * 16, "arith:1+2", "peer", 1)
    block = key_block([s, other], 5, 3)  # what the engines derive a block of positions at a time
    assert block.shape == (2, 3, KEY_WORDS)
    assert block[0].tolist() == keys[5:8] and block[1].tolist() == position_keys(other, 3, start=5)
    # the engines' keys, block by block (KEY_BLOCK positions, the last one cut at max_tokens)
    engine = PositionKeys([s, other], max_tokens=100)
    got = [engine.at(t) for t in range(100)]
    assert [g[0].tolist() for g in got] == keys and [g[1].tolist() for g in got] == position_keys(other, 100)
    assert engine._start == KEY_BLOCK and engine._block.shape[1] == 100 - KEY_BLOCK  # no key past the end


def _random_keys(n: int, seed: int = 0) -> torch.Tensor:
    rng = random.Random(seed)
    return keys_tensor([[rng.getrandbits(32) for _ in range(KEY_WORDS)] for _ in range(n)])


def test_blocks_of_rows_change_no_pick_and_no_margin(monkeypatch):
    """pick_tokens and race_margins split rows into blocks by a memory budget (smaller on a CPU than
    on a GPU); each row is its own race, so any split gives the same results."""
    import node.sampling.race as checkable

    g = torch.Generator().manual_seed(3)
    logits, keys = torch.randn(37, 3 * CHUNK + 5, generator=g) * 3, _random_keys(37, 3)
    args = (0.8, 20, 0.9)
    whole = pick_tokens(logits, keys, *args), race_margins(logits, torch.arange(37), keys, *args, slack=0.5)
    monkeypatch.setattr(checkable, "BLOCK_BYTES", 5 * 8 * logits.shape[1])  # 5 rows a block (1 with filters)
    assert torch.equal(pick_tokens(logits, keys, *args), whole[0])
    assert torch.equal(race_margins(logits, torch.arange(37), keys, *args, slack=0.5), whole[1])


@pytest.mark.parametrize("vocab, temperature, top_k, top_p, block_rows", [
    (151_936, 1.0, 0, 1.0, 0),     # a real vocabulary: 149 chunks, the last one short
    (3 * CHUNK + 5, 0.6, 0, 1.0, 5),  # blocks of 5 rows
    (3 * CHUNK + 5, 0.6, 20, 0.9, 0),  # filters: the race's sums are of the filtered row
    (50, 2.0, 0, 1.0, 0),          # one short chunk
    (3 * CHUNK + 5, 0.0, 0, 1.0, 0),  # greedy: the log-prob at T = 1
])
def test_the_picked_tokens_log_prob_is_the_unfiltered_tempered_softmax_to_float32_rounding(
        vocab, temperature, top_k, top_p, block_rows, monkeypatch):
    """`pick_with_logprobs` picks what `pick_tokens` picks, and its log-prob (from the race's chunk
    sums where no filter applies) is log softmax(logits / T)[token] of the whole row, within
    float32's rounding of the values summed: eps32 x (max |x| + log V) per row, where x = z / T."""
    import node.sampling.race as checkable

    rows = 24
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(rows, vocab, generator=g) * 6
    logits[0, : min(CHUNK, vocab) // 2] = -torch.inf  # tokens an engine's own processor masked
    keys = _random_keys(rows, 5)
    want_tokens = pick_tokens(logits, keys, temperature, top_k, top_p)
    if block_rows:
        monkeypatch.setattr(checkable, "BLOCK_BYTES", block_rows * 8 * vocab)
    tokens, logprobs = pick_with_logprobs(logits, keys, temperature, top_k, top_p)
    assert torch.equal(tokens, want_tokens) and logprobs.dtype == torch.float32
    t = temperature or 1.0
    want = torch.log_softmax(logits.double() / t, -1).gather(-1, tokens[:, None]).squeeze(-1)
    x = logits.double().abs().nan_to_num(posinf=0.0) / t
    tol = torch.finfo(torch.float32).eps * (x.amax(-1) + math.log(vocab))
    assert ((logprobs.double() - want).abs() <= tol).all(), (logprobs.double() - want).abs().max()


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square for counts against probs (Wilson-Hilferty normal approximation)."""
    n = counts.sum().item()
    expected = probs * n
    keep = expected > 0
    stat = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 50, 1.0), (1.0, 0, 0.9)])
def test_the_race_draws_from_the_filtered_tempered_softmax(temperature, top_k, top_p, monkeypatch):
    # 2.5 chunks of vocabulary, mass spread over all three: both levels of the race are exercised.
    # Chunks of 64 tokens instead of CHUNK keep 200,000 draws fast; the race reads the constant.
    import node.sampling.race

    monkeypatch.setattr(node.sampling.race, "CHUNK", 64)
    chunk = 64
    g = torch.Generator().manual_seed(1)
    vocab = 2 * chunk + chunk // 2
    logits = (torch.randn(1, vocab, generator=g) * 1.5).double()
    logits[0, :10] += 3.0  # a head of likely tokens, as a language model has
    draws = 200_000
    tokens = pick_tokens(logits.float().expand(draws, vocab), _random_keys(draws), temperature, top_k, top_p)
    probs = sampling_probs(logits, temperature, top_k, top_p)[0]
    assert (probs[tokens] > 0).all()  # never a filtered token
    counts = torch.bincount(tokens, minlength=vocab).double()
    # bin the long tail so every expected count is >= 20 (the test's approximation holds there)
    order = probs.argsort(descending=True)
    head = int((probs[order] * draws >= 20).sum())
    c = torch.cat([counts[order[:head]], counts[order[head:]].sum()[None]])
    p = torch.cat([probs[order[:head]], probs[order[head:]].sum()[None]])
    assert _chi_square_p(c, p) > 1e-3
    chunk_mass = torch.stack([probs[i * chunk:(i + 1) * chunk].sum() for i in range(3)])
    chunk_counts = torch.stack([counts[i * chunk:(i + 1) * chunk].sum() for i in range(3)])
    assert _chi_square_p(chunk_counts, chunk_mass) > 1e-3


def test_a_biased_race_fails_the_distribution_test():
    # the test above can fail: a race without the chunk level's noise (argmax of logsumexp alone)
    # always picks the heaviest chunk
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 3 * CHUNK, generator=g).double()
    keys = _random_keys(20_000)
    x = logits.float().expand(20_000, -1)
    lse = x.view(20_000, 3, CHUNK).logsumexp(-1)
    biased = lse.argmax(-1)
    fair = chunk_scores(x, keys).argmax(-1)
    mass = torch.softmax(lse[0].double(), -1)
    assert _chi_square_p(torch.bincount(biased, minlength=3).double(), mass) < 1e-6
    assert _chi_square_p(torch.bincount(fair, minlength=3).double(), mass) > 1e-3


def test_margins_by_hand_greedy_filtered_and_the_samplers_own_pick():
    z = torch.log(torch.tensor([[0.2, 0.5, 0.3]], dtype=torch.float64))
    keys = _random_keys(1, seed=3)
    # one chunk: margin = T x (best score - the token's), score = z/T + g
    idx = torch.arange(3)
    g = -torch.log(-torch.log(hash_uniform(keys[:, 2:3], keys[:, 3:4], idx)))[0]
    for temp in (1.0, 0.5):
        s = z[0] / temp + g
        for tok in range(3):
            m = race_margins(z, torch.tensor([tok]), keys, temp).item()
            assert m == pytest.approx(temp * (s.max() - s[tok]).item(), abs=1e-12)
        picked = pick_tokens(z, keys, temp)
        assert race_margins(z, picked, keys, temp).item() == 0.0
    # greedy: the logit gap to the top
    assert race_margins(z, torch.tensor([2]), keys, 0.0).item() == pytest.approx(math.log(0.5 / 0.3))
    assert pick_tokens(z, None, 0.0).item() == 1
    # top-k 2 filters token 0 out, log(0.3 / 0.2) = 0.405 logits below the second: inf unless an
    # engine within the slack could have kept it (each logit off by half of it)
    assert race_margins(z, torch.tensor([0]), keys, 1.0, top_k=2).item() == math.inf
    assert race_margins(z, torch.tensor([0]), keys, 1.0, top_k=2, slack=0.40).item() == math.inf
    assert race_margins(z, torch.tensor([0]), keys, 1.0, top_k=2, slack=0.41).item() < math.inf
    assert not audit_tokens(z, torch.tensor([0]), keys, 1.0, top_k=2, tol=0.4).item()


def test_admitted_by_hand_and_with_no_slack_the_samplers_own_filters():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64))
    # top-p 0.75 keeps 0.5 and 0.3 (0.5 above it < 0.75), drops 0.2 (0.8 above it)
    assert [m.tolist() for m in admitted(x, 0.0, top_p=0.75)] == [[[True, True, False]]] * 2
    # 0.2 may be kept by an engine that puts it 2h higher against the rest: its share of the rest
    # must reach 0.25, 0.2 e^h / (0.8 e^-h + 0.2 e^h) > 0.25  <=>  2h > log(4/3) = 0.2877
    assert not admitted(x, 0.143, top_p=0.75)[1][0, 2]
    assert admitted(x, 0.144, top_p=0.75)[1][0, 2]
    # 0.3 is kept by every such engine until 0.2 may pass it (2h > log 1.5 = 0.405): then 0.7 of 1 sits
    # above it, raised by e^h against its 0.3 e^-h, past 0.75
    assert admitted(x, 0.202, top_p=0.75)[0][0, 1] and not admitted(x, 0.203, top_p=0.75)[0][0, 1]
    g = torch.Generator().manual_seed(1)
    z = torch.randn(300, 400, generator=g, dtype=torch.float64) * 3
    for top_k, top_p in [(0, 0.9), (20, 1.0), (20, 0.95), (5, 0.5)]:
        kept = tempered(z, 0.6, top_k, top_p) > -math.inf
        for mask in admitted(z / 0.6, 0.0, top_k, top_p):
            assert torch.equal(mask, kept)


def test_admitted_with_top_k_looks_at_the_band_near_the_kth_logit_only_and_decides_alike():
    """With top-k, `admitted` runs on the tokens within 2h of the k-th logit; the result is the
    whole-row computation's, ties (bfloat16-rounded logits) included."""
    from node.sampling.filter_edges import _admitted

    g = torch.Generator().manual_seed(2)
    z = torch.randn(64, 3000, generator=g, dtype=torch.float64) * 3
    for x in (z, z.bfloat16().double()):  # bfloat16 logits tie often
        for h in (0.0, 0.05, 0.5, 2.0):
            for top_k, top_p in [(20, 1.0), (20, 0.95), (5, 0.5), (1, 0.9), (300, 0.8)]:
                band, whole = admitted(x, h, top_k, top_p), _admitted(x, h, top_k, top_p)
                assert torch.equal(band[0], whole[0]) and torch.equal(band[1], whole[1]), (h, top_k, top_p)


def test_admitted_with_top_p_alone_looks_at_the_nucleus_band_only_and_decides_alike():
    """With top-p alone, `admitted` runs on the tokens within 4h below the edge of the mass that
    no engine within h keeps a token past (`_top_p_band`), told the mass below; the result is the
    whole-row computation's, ties included. The edge's mass is what the test checks: at top_p
    itself (no e^h terms) the band misses tokens some engine keeps."""
    from node.sampling.filter_edges import _admitted, _top_p_band

    g = torch.Generator().manual_seed(3)
    used = 0
    for scale, vocab in ((3.0, 3000), (1.5, 3000), (6.0, 3000), (3.0, 8000)):
        z = torch.randn(32, vocab, generator=g, dtype=torch.float64) * scale
        for x in (z, z.bfloat16().double()):  # bfloat16 logits tie often
            for h in (0.0, 0.05, 0.5, 2.0):
                for top_p in (0.5, 0.9, 0.95, 0.99, 0.999):
                    used += _top_p_band(x, h, top_p) is not None
                    band, whole = admitted(x, h, 0, top_p), _admitted(x, h, 0, top_p)
                    assert torch.equal(band[0], whole[0]) and torch.equal(band[1], whole[1]), (scale, vocab, h, top_p)
    assert used >= 40  # the band, not the whole-row fallback, decided most of them


@pytest.mark.parametrize("top_k,top_p,vocab", [(0, 0.95, 200), (20, 1.0, 200), (20, 0.95, 200), (5, 0.6, 200),
                                               (0, 0.95, 3 * CHUNK - 100), (300, 0.9, 3 * CHUNK - 100)])
def test_an_engine_within_the_slack_passes_at_the_filters_edges(top_k, top_p, vocab):
    # an engine whose logits are off by at most m/2 picks its race's token among the tokens its own
    # filters keep; at the auditor, with slack m, that token is at most m short. With no slack the
    # edges fail it: its token outside our filters (inf), or a token only we keep winning our race.
    # Three chunks: the chunk level too (logits flatter, so that the filters keep several chunks)
    n, m, temp = 3000 if vocab < CHUNK else 600, 1.0, 0.6
    g = torch.Generator().manual_seed(top_k + vocab)
    z = torch.randn(n, vocab, generator=g, dtype=torch.float64) * (2.5 if vocab < CHUNK else 0.8)
    e = (torch.rand(n, vocab, generator=g, dtype=torch.float64) * 2 - 1) * m / 2
    keys = _random_keys(n, seed=top_k)
    theirs = pick_tokens(z + e, keys, temp, top_k, top_p)
    assert vocab < CHUNK or (theirs // CHUNK).unique().numel() == 3
    assert (race_margins(z, theirs, keys, temp, top_k, top_p, slack=m) <= m + 1e-5).all()
    plain = race_margins(z, theirs, keys, temp, top_k, top_p)
    assert (plain == math.inf).sum() > 5 and (plain > m).sum() > (plain == math.inf).sum()
    # and the slack admits little else: a token ranked far below the edge stays out
    last = z.argmin(-1)
    assert (race_margins(z, last, keys, temp, top_k, top_p, slack=m) == math.inf).all()


@pytest.mark.parametrize("vocab", [99, 32_768, 151_936])
def test_an_honest_engine_is_at_most_twice_its_logit_error_short_whatever_the_vocabulary(vocab):
    # the bound the audit's tolerance rests on: another engine's logits z + e pick their race's
    # best token; under z it is short of the best by <= 2 max|e| (in logits), at both levels
    g = torch.Generator().manual_seed(vocab)
    n = 64
    z = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 3
    e = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 0.05
    keys = _random_keys(n, seed=vocab)
    for temp in (1.0, 0.6):
        theirs = pick_tokens(z + e, keys, temp)
        margins = race_margins(z, theirs, keys, temp)
        bound = 2 * e.abs().amax(-1)
        assert (margins <= bound + 1e-5).all()  # float32 scores on the sampler's side: ~1e-5
        flipped = margins > FLIP_MARGIN
        assert flipped.float().mean() < 0.25  # most picks are the auditor's own


def test_a_chosen_token_is_far_short_at_most_positions():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(2000, 4096, generator=g, dtype=torch.float64) * 3
    keys = _random_keys(2000, seed=9)
    honest = pick_tokens(z, keys, 1.0)
    chosen = z.topk(2, -1).indices[:, 1]  # the second most likely token, wherever the race was not it
    chosen = torch.where(chosen == honest, z.topk(3, -1).indices[:, 2], chosen)
    margins = race_margins(z, chosen, keys, 1.0)
    assert (margins > 0.5).float().mean() > 0.6


def test_judge_margins_counts_failures_exceedances_and_flips():
    m = torch.tensor([0.0, 0.0, 2e-3, 0.3, 0.6, 1.2], dtype=torch.float64)
    # past the hard bound (1.2 > 1): the group fails; 0.6 is an exceedance (in (0.5, 1]); flips > 1e-3
    r = judge_margins(m, 0.01, tol=0.5, hard=1.0)
    assert (r.passed, r.positions, r.failed_positions, r.exceedances, r.flips, r.max_margin) == (False, 6, 1, 1, 4, 1.2)
    # within a wider hard bound both are exceedances, and the group passes
    r = judge_margins(m, 0.01, tol=0.5, hard=2.0)
    assert (r.passed, r.failed_positions, r.exceedances) == (True, 0, 2)
    # no hard bound given: the tolerance is one, every exceedance fails
    r = judge_margins(m, 0.01, tol=0.5)
    assert (r.passed, r.failed_positions, r.exceedances) == (False, 2, 0)
    assert judge_margins(m[:4], 0.0, tol=0.5).passed
    assert judge_margins(torch.tensor([0.2, torch.inf], dtype=torch.float64), 0.0, tol=0.5, hard=8.0).failed_positions == 1


def test_a_slack_of_any_width_neither_overflows_nor_filters_out_a_token():
    """e^(slack / T) overflowed a float past ~700 (a config with a margin of 1000 crashed every
    audit). Every engine within a huge slack could keep any token, so none is filtered out (inf)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 40, generator=g) * 3
    keys = keys_tensor(position_keys(bytes(32), 6), "cpu")
    tokens = torch.arange(6) * 7
    for slack in (1.0, 1000.0, 1e6):
        m = race_margins(logits, tokens, keys, 0.6, top_k=5, top_p=0.9, slack=slack)
        assert m.shape == (6,) and not m.isnan().any()
    assert m.isfinite().all()


def test_a_token_only_a_wider_engine_keeps_counts_at_the_hard_bound_and_one_none_keeps_fails():
    """top-k 2 over logits (5, 4, 2.5, -10, ...): the third token is 1.5 logits below the second,
    past what an engine within tol = 1 (0.5 each way) could swap, but within hard = 8: margin 8,
    an exceedance. The fourth is 14 below: no engine within 8 keeps it, inf. The first two race."""
    logits = torch.tensor([[5.0, 4.0, 2.5, -10.0] + [-20.0] * 60] * 4)
    keys = keys_tensor(position_keys(bytes(32), 4), "cpu")
    p = SamplingParams(n=1, max_new_tokens=4, temperature=0.6, top_k=2)
    m = margins_at(logits, torch.tensor([0, 1, 2, 3]), keys, p, slack=1.0, hard=8.0)
    assert m[2] == 8.0 and m[3] == torch.inf and m[:2].isfinite().all() and m[:2].min() == 0
    assert margins_at(logits, torch.tensor([2]), keys[:1], p, slack=1.0)[0] == torch.inf  # without a hard bound
    r = judge_margins(m, 0.0, tol=1.0, hard=8.0)
    assert (r.passed, r.failed_positions, r.exceedances) == (False, 1, 1 + int(m[:2].max() > 1.0))
    # (30, 9, 5, ...): the third is 4 below the second, so an engine within 8 could keep it, but the
    # first, 21 above the third, is kept by every such engine and beats it by ~25 logits: that
    # margin, a failure, not the hard bound
    far = torch.tensor([[30.0, 9.0, 5.0] + [-20.0] * 61] * 4)
    m = margins_at(far, torch.tensor([2] * 4), keys, p, slack=1.0, hard=8.0)
    wide = race_margins(far, torch.tensor([2] * 4), keys, p.temperature, p.top_k, p.top_p, 8.0)
    assert (m == wide).all() and (m > 8.0).all() and m.isfinite().all(), m
    assert not judge_margins(m, 0.0, tol=1.0, hard=8.0).passed


def test_the_exceedance_test_by_hand_one_edit_a_group_is_refused_at_the_twelfth_audited_group(tmp_path):
    """AuditConfig.exceed_rate's docstring: one exceedance in every group of 800 positions, at the
    honest ceiling 3e-4 and alarm 1e-3 / 2. Per group: log 4 + 799 log((1 - 1.2e-3) / (1 - 3e-4))
    = 1.386294 - 0.719640 = 0.666655; the threshold log(1.1 / 5e-4) = log(2200) = 7.696213 needs
    7.696213 / 0.666655 = 11.5, so 12 groups. An honest engine at 3e-4 has 0.24 exceedances a group and drifts down. The test is the
    learner's own (Auditor.exceed_test, at the shipped AuditConfig)."""
    from helpers.inmemory import tiny_swarm

    learner = tiny_swarm(tmp_path, samplers=0).learner
    assert (learner.cfg.audit.exceed_rate, learner.cfg.audit.alarm) == (3e-4, 1e-3)  # the figures below
    per_group = math.log(4) + 799 * math.log((1 - 1.2e-3) / (1 - 3e-4))
    assert per_group == pytest.approx(0.666655, abs=1e-6)
    test = learner.auditor.exceed_test
    assert test.threshold == pytest.approx(7.696213, abs=1e-6)
    refused = next(n for n in range(1, 100) if test.add("s", 1, 800))
    assert refused == 12 and test.llr["s"] == pytest.approx(12 * per_group)
    assert "12 tokens past the margin in 9600 audited positions" in test.why("s")
    honest = FlipTest(3e-4, 1e-3 / 2)
    assert not any(honest.add("h", k, 800) for k in [0, 0, 1, 0, 0, 0, 1] * 20)  # 2 in 5,600: 1.2x the rate
    assert honest.llr["h"] < 0


def test_a_long_honest_record_buys_a_cheater_at_most_the_floor_by_hand():
    """FlipTest's floor, -log(10 x 1e6) = -16.118096: 1,000 audited groups of 800 positions with no
    exceedance (each 800 log((1 - 1.2e-3) / (1 - 3e-4)) = -0.720540) would have banked 720.5 nats;
    the floor keeps 16.118096, so one edit a group (0.666655 each, as above) reaches log(2200) =
    7.696213 after (16.118096 + 7.696213) / 0.666655 = 35.7: the 36th group, not the 1,093rd."""
    test = FlipTest(3e-4, 1e-3 / 2)
    assert test.floor == pytest.approx(-16.118096, abs=1e-6)
    assert not any(test.add("s", 0, 800) for _ in range(1000))
    assert test.llr["s"] == test.floor
    refused = next(n for n in range(1, 2000) if test.add("s", 1, 800))
    assert refused == 36
    # the reason quotes the stretch the sum holds, not the lifetime's 36 in 828,800 (0.004%)
    assert "36 flips in 28800 audited positions" in test.why("s")
    # a sum saved before the floor existed is read at the floor
    restored = FlipTest(3e-4, 1e-3 / 2)
    restored.load_state_dict({"llr": {"s": -721.0}, "flips": {}, "positions": {}})
    assert restored.llr["s"] == restored.floor
    # a group can only lift the sum from the floor by what it adds: 3 edits at once, from the floor
    again = FlipTest(3e-4, 1e-3 / 2)
    again.add("t", 0, 800 * 1000)
    again.add("t", 3, 800)
    per = 3 * math.log(4) + 797 * math.log((1 - 1.2e-3) / (1 - 3e-4))
    assert again.llr["t"] == pytest.approx(again.floor + per)


def test_flip_llr_by_hand():
    # 2 flips in 100 positions, honest rate 1%, alternative 4%
    want = 2 * math.log(4) + 98 * math.log(0.96 / 0.99)
    assert flip_llr(2, 100, 0.01, 4.0) == pytest.approx(want)


def test_the_flip_test_keeps_honest_engines_and_refuses_a_sampler_that_flips_more():
    rate, alarm = 0.02, 1e-3
    rng = random.Random(0)
    positions = 256  # a group: 8 completions of 32 tokens

    def groups_until_alarm(flip_rate: float, limit: int) -> int | None:
        test = FlipTest(rate, alarm)
        for n in range(1, limit + 1):
            flips = sum(rng.random() < flip_rate for _ in range(positions))
            if test.add("s", flips, positions):
                return n
        return None

    # honest engines at the highest honest rate: Ville's bound says <= 0.1% over a million groups; 200 of them x 300 groups
    alarms = sum(groups_until_alarm(rate, 300) is not None for _ in range(200))
    assert alarms <= 2
    # a sampler that flips at 4x the rate is refused within a few groups, every time
    caught = [groups_until_alarm(4 * rate, 300) for _ in range(20)]
    assert all(c is not None and c <= 10 for c in caught), caught
    test = FlipTest(rate, alarm)
    test.add("s", 30, 256)
    restored = FlipTest(rate, alarm)
    restored.load_state_dict(test.state_dict())
    assert restored.llr == test.llr and restored.flips["s"] == 30 and "30 flips in 256" in restored.why("s")


def test_the_flip_rate_is_twice_the_measured_honest_rate_within_a_floor_and_the_ceiling():
    from node.audit.flips import FlipRate, wilson_upper

    r = FlipRate()
    assert r.rate(cap=0.06) == 0.06  # nothing measured yet: the ceiling
    r.add(34, 10_000)  # the built-in model's bfloat16: 0.34%
    assert r.rate(cap=0.06) == pytest.approx(2 * wilson_upper(34, 10_000))
    assert 0.0068 < r.rate(cap=0.06) < 0.0095
    r.add(4_000, 10_000)  # a model whose honest engines flip a lot: the ceiling holds
    assert r.rate(cap=0.06) == 0.06
    quiet = FlipRate()
    quiet.add(0, 1_000_000)
    assert quiet.rate(cap=0.06) == FlipRate.FLOOR
    restored = FlipRate()
    restored.load_state_dict(r.state_dict())
    assert (restored.flips, restored.positions) == (4_034, 20_000)


def test_the_auditor_counts_its_own_bfloat16_flips_beside_an_unchanged_float32_audit():
    from node.audit.margins import AuditItem, audit_margins
    from node.sampling.race import group_seeds
    from node.sampling.params import SamplingParams
    from node.models import BUILTIN_MODEL, load_model, load_tokenizer

    tok, model = load_tokenizer(BUILTIN_MODEL), load_model(BUILTIN_MODEL).eval()
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ("12+7=", "35+48=", "7*8=")]
    g = torch.Generator().manual_seed(0)
    items = [AuditItem(p, [(torch.randint(3, 20, (6,), generator=g).tolist(), [-1.0] * 6) for _ in range(4)],
                       group_seeds(bytes(16), f"p{i}", "s", 4)) for i, p in enumerate(prompts)]
    plain = audit_margins(model, items, params, tok.pad_token_id)
    both = audit_margins(model, items, params, tok.pad_token_id, reference=True)
    assert all(torch.equal(a[0], b[0]) and a[1] == b[1] and a[2] is None for a, b in zip(plain, both))
    assert all(0 <= b[2] <= len(b[0]) for b in both)
