"""From scored groups to an optimizer step: alignment, skipping, parameters changing, bad batches."""

import math

import pytest
import torch

from helpers.numerics import U32
from node.algorithms import get_algorithm
from node.engines.base import Completion
from node.models import BUILTIN_MODEL, load_model, load_tokenizer
from node.training.batch import ScoredGroup, TrainPart, build_batch
from node.training.step import train_step


def comp(ids, lps):
    return Completion(token_ids=ids, text="", logprobs=lps, finish_reason="stop")


def test_build_batch_aligns_behaviour_logprobs_and_skips_zero_variance_groups():
    g1 = ScoredGroup("a", [5, 6], [comp([7, 1], [-0.1, -0.2]), comp([8], [-0.3])], [1.0, 0.0], "m", 0)
    g2 = ScoredGroup("b", [5], [comp([9, 9, 1], [-1.0, -2.0, -3.0]), comp([1], [-0.5])], [1.0, 1.0], "m", 0)
    g3 = ScoredGroup("c", [4, 4, 4], [comp([2], [-0.7]), comp([3, 1], [-0.8, -0.9])], [0.0, 1.0], "m", 0)
    b = build_batch([g1, g2, g3], normalize_std=False, pad_id=0)
    assert (b.groups_used, b.groups_skipped) == (2, 1)
    assert b.advantages.tolist() == [0.5, -0.5, -0.5, 0.5]
    assert b.packed.input_ids.tolist() == [[5, 6, 7, 1, 0], [5, 6, 8, 0, 0], [4, 4, 4, 2, 0], [4, 4, 4, 3, 1]]
    m = b.packed.completion_mask
    assert m.tolist() == [[0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    # behaviour log-probs sit exactly where the learner's next-token log-probs of those tokens sit
    assert b.old_logp[m].tolist() == pytest.approx([-0.1, -0.2, -0.3, -0.7, -0.8, -0.9])
    assert build_batch([g2], normalize_std=True, pad_id=0) is None
    # GEPO's released code keeps them: every row packed, the equal-reward group at advantage 0
    kept = build_batch([g1, g2, g3], normalize_std=False, pad_id=0, keep_zero_variance=True)
    assert (kept.groups_used, kept.groups_skipped) == (3, 0)
    assert kept.advantages.tolist() == [0.5, -0.5, 0.0, 0.0, -0.5, 0.5]


def test_shuffled_blocks_mix_prompts_reproducibly():
    from node.training.step import shuffled_blocks

    old = torch.randn(20, 5, generator=torch.Generator().manual_seed(0))
    blocks = shuffled_blocks(old, 8)
    assert sorted(torch.bincount(blocks).tolist()) == [4, 8, 8]  # 20 rows: two blocks of 8 and the rest
    assert torch.equal(blocks, shuffled_blocks(old.clone(), 8))  # a function of the data: every rank agrees
    assert not torch.equal(blocks, torch.arange(20) // 8)  # shuffled, so consecutive rows (a group) split
    assert not torch.equal(blocks, shuffled_blocks(old + 1, 8))


@pytest.fixture(scope="module")
def model_and_tok():
    return load_model(BUILTIN_MODEL), load_tokenizer(BUILTIN_MODEL)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "gspo", "gepo", "ftis"])
def test_train_step_changes_parameters_with_every_loss(model_and_tok, name):
    model, tok = model_and_tok
    torch.manual_seed(0)
    model = type(model)(model.config)
    model.load_state_dict(model_and_tok[0].state_dict())
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    group = ScoredGroup("p", ids("12+7="), [comp(ids("19") + [1], [-0.5, -0.6, -0.1]),
                                           comp(ids("18") + [1], [-0.5, -1.2, -0.1])], [1.0, 0.0], "m", 0)
    algo = get_algorithm(name)
    cfg = algo.make_config()
    batch = build_batch([group], cfg.normalize_std, tok.pad_token_id)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    metrics = train_step(model, opt, [TrainPart(name, batch, algo, cfg)], temperature=1.0)
    assert metrics["step_skipped"] == 0 and math.isfinite(metrics["loss"])
    changed = sum(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert changed > len(before) // 2


def test_non_finite_behaviour_logprobs_skip_the_step_without_touching_weights(model_and_tok):
    model, tok = model_and_tok
    group = ScoredGroup("p", [4, 5, 13], [comp([6, 1], [float("nan"), -0.1]), comp([7, 1], [-0.3, -0.1])],
                        [1.0, 0.0], "m", 0)
    algo = get_algorithm("grpo")
    batch = build_batch([group], True, tok.pad_token_id)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = train_step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), [TrainPart("grpo", batch, algo, algo.make_config())], 1.0)
    assert metrics["step_skipped"] == 1
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---- micro-batches: the same step under any token budget -------------------------------------

def _groups(tok, n_groups=3, size=4, seed=0):
    """Groups with completions of different lengths, rewards with signal, behaviour log-probs near
    (not at) the model's: ratios differ from 1, so clipping and the GEPO/F-TIS weights all act."""
    g = torch.Generator().manual_seed(seed)
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    groups = []
    for k in range(n_groups):
        comps = []
        for j in range(size):
            toks = ids(str(1000 * (k + 1) + 37 * j)[: 1 + (j + k) % 4]) + [1]
            lps = (-1.5 - torch.rand(len(toks), generator=g)).tolist()
            comps.append(comp(toks, lps))
        rewards = [float((j + k) % 2) for j in range(size)]
        groups.append(ScoredGroup(f"p{k}", ids(f"{k + 3}*{k + 7}="), comps, rewards, "m", 0))
    return groups


def _grads_after(model0, parts, options):
    """The step's gradients and metrics, computed in float64 (model, log-probs and loss: the
    behaviour log-probs and advantages are float32 data, promoted). Two runs that differ only in
    how the step is cut into micro-batches then differ only by float64 rounding (see GRAD_TOL)."""
    model = type(model0)(model0.config)
    model.load_state_dict(model0.state_dict())
    model.to(torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # a step that moves nothing: the grads stay to compare
    metrics = train_step(model, opt, parts, temperature=0.7, max_grad_norm=1e9, options=options)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, metrics


GRAD_TOL = 1e-10
"""|g_micro - g_full| <= GRAD_TOL * max|g_full| per tensor. Both runs are float64 end to end
(node/training/logprobs.py keeps a float64 model's log-probs in float64) and cutting a step into
micro-batches only reorders sums. Reordering a sum of n terms moves it by at most ~n * u * sum|terms|
(Higham, ch. 4; u = 1.1e-16 in float64); here n <~ 1e3 (~100 tokens, widths <= 384) and, allowing
sum|terms| up to 100 max|g| for cancellation, that is <~ 1.1e-11 max|g|: GRAD_TOL keeps a 10x margin
(measured: <= 5e-15 max|g|, also with ATEN_CPU_CAPABILITY=default). Float32 gave up to 1.5e-5 max|g|,
varying with the CPU (issue 25). A real error (a wrong normaliser, a row dropped or counted twice)
moves entries by a row's share of the gradient; a part's share off by 1e-7 relative already fails."""


def _assert_same_grads(micro: dict, full: dict) -> None:
    assert full.keys() == micro.keys()
    for n, g in full.items():
        assert g.dtype == torch.float64, n
        atol = GRAD_TOL * float(g.abs().max())
        torch.testing.assert_close(micro[n], g, rtol=0.0, atol=atol, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("name,options", [
    ("grpo", {}), ("grpo", {"aggregation": "token_mean"}), ("dr_grpo", {}), ("gspo", {"eps_low": 0.2, "eps_high": 0.2}),
    ("gepo", {"beta": 0.05}), ("gepo_lenclip", {}), ("gepo", {"e_hat_rows": 3, "beta": 0.005, "dual_clip": math.inf}), ("ftis", {}), ("pg", {}),
])
def test_micro_batches_give_the_full_batch_gradient_for_every_loss(model_and_tok, name, options):
    from node.training.step import StepOptions, plan_microbatches

    model, tok = model_and_tok
    algo = get_algorithm(name)
    cfg = algo.make_config(options)
    groups = _groups(tok)
    liar = groups[1].completions[2]
    liar.logprobs = [-18.0] * len(liar.token_ids)  # fails the log-prob check: dropped in both runs alike
    batch = build_batch(groups, cfg.normalize_std, tok.pad_token_id)
    gap = 4.0 if name != "ftis" else None
    parts = [TrainPart(name, batch, algo, cfg, gap)]
    full, m_full = _grads_after(model, parts, StepOptions())
    lengths = batch.packed.attention_mask.sum(-1).tolist()
    budget = 2 * max(lengths)  # two rows per micro-batch: groups of 4 are split
    plan = plan_microbatches(lengths, budget)
    assert len(plan) >= 5 and any(len({int(batch.group_ids[i]) for i in rows}) > 1 for rows in plan)
    assert any(len([r for rows in plan for r in rows if int(batch.group_ids[r]) == g]) > max(map(len, plan))
               for g in range(3))  # some group is spread over several micro-batches
    micro, m_micro = _grads_after(model, parts, StepOptions(max_tokens_per_microbatch=budget))
    assert len(full) > 10
    _assert_same_grads(micro, full)
    # the loss: a float64 sum over <= 12 rows and <= 7 micro-batches of terms |t| <~ 50 (pg's
    # -A * sum_t log-prob the largest), reordered: within ~20 u * 600 ~ 1.3e-12 (float32: off by 3e-8)
    assert m_micro["loss"] == pytest.approx(m_full["loss"], rel=0, abs=1e-10)
    if gap is not None:
        assert m_full["routes"][name]["dropped_groups"] == m_micro["routes"][name]["dropped_groups"]
        assert 1 in m_full["routes"][name]["dropped_groups"]


@pytest.mark.parametrize("name", ["grpo", "gspo", "gepo", "m2po", "pg"])
def test_micro_batches_give_the_full_batch_gradient_with_the_rollout_correction(model_and_tok, name):
    from node.learner.behaviour import with_logprobs
    from node.training.step import StepOptions

    model, tok = model_and_tok
    algo = get_algorithm(name)
    cfg = algo.make_config()
    groups = _groups(tok)
    g = torch.Generator().manual_seed(1)
    # groups 0 and 2 recomputed: "ours" within +-1.2 nats of the claims, so some weights pass the cap of 2
    for k in (0, 2):
        ours = [(torch.tensor(c.logprobs) + 2.4 * torch.rand(len(c.logprobs), generator=g) - 1.2).tolist()
                for c in groups[k].completions]
        groups[k] = with_logprobs(groups[k], ours)
    batch = build_batch(groups, cfg.normalize_std, tok.pad_token_id)
    parts = [TrainPart(name, batch, algo, cfg, 4.0, 2.0)]
    full, m_full = _grads_after(model, parts, StepOptions())
    budget = 2 * max(batch.packed.attention_mask.sum(-1).tolist())
    micro, m_micro = _grads_after(model, parts, StepOptions(max_tokens_per_microbatch=budget))
    _assert_same_grads(micro, full)
    unweighted, _ = _grads_after(model, [TrainPart(name, batch, algo, cfg, 4.0)], StepOptions())
    assert any(not torch.allclose(unweighted[n], full[n], rtol=1e-3, atol=0) for n in full)  # the weights act
    route = m_full["routes"][name]
    assert 0 < route["rollout_truncated_frac"] < 1 and route["rollout_weight_mean"] <= 2.0
    assert route["rollout_weight_mean"] == pytest.approx(m_micro["routes"][name]["rollout_weight_mean"], abs=1e-12)
    # over the recomputed groups' sequences alone: group 1 kept its claims (weight 1 by construction,
    # which would pull the mean toward 1 and the truncated share toward 0)
    # (every sequence kept: no log-prob check, which drops some of these made-up log-probs)
    _, m_all = _grads_after(model, [TrainPart(name, batch, algo, cfg, None, 2.0)], StepOptions(max_tokens_per_microbatch=budget))
    route = m_all["routes"][name]
    rows = [i for i, gid in enumerate(batch.group_ids.tolist()) if gid in (0, 2)]
    mask, bound = batch.packed.completion_mask, math.log(2.0)
    per_seq = [batch.rollout_log_weight[i][mask[i]].double() for i in rows]
    assert route["rollout_sequences"] == len(rows) < len(batch.group_ids)
    assert route["rollout_weight_mean"] == pytest.approx(
        sum(float(w.clamp(-bound, bound).exp().mean()) for w in per_seq) / len(rows), abs=1e-12)
    assert route["rollout_truncated_frac"] == pytest.approx(
        sum(float((w.abs() > bound).double().mean()) for w in per_seq) / len(rows), abs=1e-12)


def test_a_step_figure_only_some_routes_report_is_weighted_over_those_routes_alone():
    from node.training.step import share_weighted

    routes = {"own": {"share": 0.75, "drift_frac": 0.2, "clip_frac": 0.1},
              "foreign": {"share": 0.25, "clip_frac": 0.5}, "empty": {"dropped_groups": [3]}}
    assert share_weighted(routes, "drift_frac") == pytest.approx(0.2)  # not 0.75 * 0.2: own's figure
    assert share_weighted(routes, "clip_frac") == pytest.approx(0.75 * 0.1 + 0.25 * 0.5)


def test_the_guard_reads_the_median_sequence_so_a_few_forged_claims_do_not_move_it(model_and_tok):
    from node.algorithms.base import k3, seq_mean
    from node.training.logprobs import completion_logprobs

    model0, tok = model_and_tok
    # float64 end to end, so that the step's median equals the one computed here but for the one
    # rounding the step applies: it keeps each sequence's k3 as float32 (relative error <= U32)
    model = type(model0)(model0.config)
    model.load_state_dict(model0.state_dict())
    model.to(torch.float64)
    algo = get_algorithm("grpo")
    groups = _groups(tok, 4, 4, seed=3)
    batch = build_batch(groups, True, tok.pad_token_id)
    with torch.no_grad():  # honest claims: the model's own log-probs, plus a small staleness-like drift
        own = completion_logprobs(model, batch.packed, 1.0)
    mask = batch.packed.completion_mask
    drift = 0.05 * torch.randn(own.shape, generator=torch.Generator().manual_seed(0))
    batch.old_logp = torch.where(mask, own + drift, 0.0)
    honest = seq_mean(k3(batch.old_logp - own), mask)
    liars = batch.group_ids == 0  # one group of four (a sampler's) claims 3.5 nats below, within the gap check
    batch.old_logp = torch.where(mask & liars[:, None], own - 3.5, batch.old_logp)
    lr0 = 0.0
    opt = torch.optim.SGD(model.parameters(), lr=lr0)
    m = train_step(model, opt, [TrainPart("stale", batch, algo, algo.make_config(), 4.0)], 1.0, lr=lr0)
    route = m["routes"]["stale"]
    assert route["dropped_groups"] == []  # within the gap check: the forged rows are trained on
    forged = float(k3(torch.tensor(-3.5)))  # e^-3.5 + 3.5 - 1 ~ 2.53 per token
    assert route["kl_k3"] > forged / 4 > 0.6  # the mean: a quarter of the rows at 2.53 sets it
    every = sorted(honest[~liars].tolist() + [forged] * int(liars.sum()))
    assert route["kl_k3_median"] == pytest.approx((every[7] + every[8]) / 2, rel=2 * U32)  # 16 rows
    assert route["kl_k3_median"] < 0.01


def test_micro_batches_across_two_parts_weight_each_part_by_its_share(model_and_tok):
    from node.training.step import StepOptions

    model, tok = model_and_tok
    gepo, ftis = get_algorithm("gepo"), get_algorithm("ftis")
    b1 = build_batch(_groups(tok, 2, 4, seed=1), False, tok.pad_token_id)
    b2 = build_batch(_groups(tok, 1, 6, seed=2), True, tok.pad_token_id)
    parts = [TrainPart("stale", b1, gepo, gepo.make_config(), 4.0), TrainPart("foreign", b2, ftis, ftis.make_config())]
    full, _ = _grads_after(model, parts, StepOptions())
    micro, _ = _grads_after(model, parts, StepOptions(max_tokens_per_microbatch=12))
    _assert_same_grads(micro, full)


def test_plan_microbatches_respects_the_budget_and_keeps_every_row_once():
    from node.training.step import plan_microbatches

    lengths = [5, 17, 3, 9, 9, 40, 1]
    plan = plan_microbatches(lengths, 20)
    assert sorted(i for rows in plan for i in rows) == list(range(7))
    for rows in plan:
        assert len(rows) * max(lengths[i] for i in rows) <= 20 or len(rows) == 1
    assert [5] in plan  # longer than the budget: alone
    assert plan_microbatches(lengths, None) == [[5, 1, 3, 4, 0, 2, 6]]
    assert plan_microbatches([], 10) == []


# ---- devices: every tensor the node makes sits on its inputs' device -------------------------

def test_no_tensor_is_made_off_its_inputs_device(model_and_tok):
    """With torch's default device set to `meta`, a tensor made without an explicit device lands
    on meta and fails at once against the CPU inputs: this catches each place that would put a
    tensor on the wrong GPU (or the CPU) once inputs live on cuda:N."""
    from node.training.step import StepOptions
    from node.weights.codec import Publisher, PublishConfig, apply_version

    model, tok = model_and_tok
    groups = _groups(tok)
    algos = [(n, get_algorithm(n)) for n in ("grpo", "dr_grpo", "gspo", "gepo", "ftis", "pg")]
    batches = [build_batch(groups, a.make_config().normalize_std, tok.pad_token_id) for _, a in algos]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.set_default_device("meta")
    try:
        for (name, algo), batch in zip(algos, batches):
            for budget in (None, 30):
                m = train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), [TrainPart(name, batch, algo, algo.make_config(), 4.0)],
                               1.0, options=StepOptions(max_tokens_per_microbatch=budget))
                assert m["step_skipped"] == 0 and math.isfinite(m["loss"]), name
                assert all(p.grad is None or p.grad.device.type == "cpu" for p in model.parameters())
        pub = Publisher(PublishConfig(view="bfloat16", keyframe_every=3, keyframe_bytes=100), torch.bfloat16)
        held = None  # what a sampler rebuilds: a keyframe, then patches applied to it
        for v in range(3):
            # a few ulps per element: patches (t + v would make a keyframe smaller than the patch)
            enc = pub.publish({k: t * (1 + v * 2**-6) for k, t in state.items()}, v)
            held = apply_version(held, enc)
            assert held.device.type == "cpu"
        assert enc.base == 1 and torch.equal(held, pub.published)
    finally:
        torch.set_default_device(None)
        model.load_state_dict(state)


def test_a_model_with_dropout_trains_on_the_policy_the_samplers_ran(tmp_path):
    """GPT-2's config has dropout 0.1 (embeddings, residuals, attention): in train mode, which the
    learner's step uses, its log-probs were a random function of the policy's (0.04 nats a token
    off); a model loaded for any role, or handed to a Learner, has every rate zeroed."""
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen3Config, Qwen3ForCausalLM

    from node.training.logprobs import completion_logprobs, pack
    from node.models import without_dropout

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=64)).save_pretrained(tmp_path)
    batch = pack([[1, 2, 3], [4, 5]], [[6, 7, 8, 9], [10, 11]], 0)
    m = batch.completion_mask

    def logp(model, train: bool) -> torch.Tensor:
        with torch.no_grad():
            return completion_logprobs(model.train(train), batch, 1.0)[m]

    raw = GPT2LMHeadModel.from_pretrained(tmp_path)
    assert not torch.equal(logp(raw, True), logp(raw, False))  # what the learner trained on before
    model = load_model(str(tmp_path))
    assert torch.equal(logp(model, True), logp(model, False))
    assert model.config.resid_pdrop == model.config.attn_pdrop == model.config.embd_pdrop == 0.0
    # attention that reads a float rate, not an nn.Dropout (Qwen3, Llama): zeroed too
    qwen = Qwen3ForCausalLM(Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, head_dim=16, vocab_size=64, attention_dropout=0.3))
    assert qwen.model.layers[0].self_attn.attention_dropout == 0.3
    without_dropout(qwen)
    assert qwen.model.layers[0].self_attn.attention_dropout == 0.0 and qwen.config.attention_dropout == 0.0
