"""The HF engine on the built-in model: groups, finish reasons, and log-prob agreement with the learner."""

import pytest
import torch

from node.sampling.params import SamplingParams
from node.engines.hf import HFEngine
from node.training.logprobs import completion_logits, completion_logprobs, completion_span, pack
from node.models import BUILTIN_MODEL, BUILTIN_MODEL_B, load_model, load_tokenizer, resolve_model_path
from helpers.numerics import float32_logprob_tol

PROMPTS = ["12+7=", "35+48=", "7*8=", "99+99="]


@pytest.fixture(scope="module")
def engine():
    torch.manual_seed(0)
    return HFEngine(load_model(BUILTIN_MODEL), load_tokenizer(BUILTIN_MODEL), BUILTIN_MODEL)


@pytest.fixture(scope="module")
def engine64():
    """The engine on float64 weights: its forward (KV cache, one position at a time) and the
    learner's (one pass) then agree to ~1e-15, and what is left of the gap is the engine's float32
    log-softmax, which numerics.float32_logprob_tol bounds on any CPU."""
    torch.manual_seed(0)
    return HFEngine(load_model(BUILTIN_MODEL, torch.float64), load_tokenizer(BUILTIN_MODEL), BUILTIN_MODEL)


def test_groups_of_g_with_tokens_text_and_finish_reasons(engine):
    res = engine.generate(PROMPTS, SamplingParams(n=5, temperature=1.0, max_new_tokens=4))
    assert [r.prompt for r in res] == PROMPTS
    eos = engine.tokenizer.eos_token_id
    for r in res:
        assert r.prompt_token_ids == engine.tokenizer(r.prompt, add_special_tokens=False)["input_ids"]
        assert len(r.completions) == 5
        for c in r.completions:
            assert len(c.token_ids) == len(c.logprobs) <= 4
            assert c.finish_reason == ("stop" if c.token_ids[-1] == eos else "length")
            assert eos not in c.token_ids[:-1]
            assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            assert all(lp <= 0 for lp in c.logprobs)
    stopped = engine.generate(["12+7="], SamplingParams(n=8, temperature=1.0, max_new_tokens=1))[0]
    assert any(c.finish_reason == "length" for c in stopped.completions)


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.3, 1.0, 5)])
def test_learner_recomputes_the_engines_logprobs(engine64, temperature, top_p, top_k, capsys):
    engine = engine64
    params = SamplingParams(n=6, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=6)
    res = engine.generate(PROMPTS, params)
    prompts = [r.prompt_token_ids for r in res for _ in r.completions]
    comps = [c for r in res for c in r.completions]
    batch = pack(prompts, [c.token_ids for c in comps], engine.tokenizer.pad_token_id)
    with torch.no_grad():
        learner = completion_logprobs(engine.model, batch, temperature)
        logits = torch.cat([z for _, z in completion_logits(engine.model, batch)])
    assert learner.dtype == logits.dtype == torch.float64
    tol = float32_logprob_tol(logits, temperature, [lp for c in comps for lp in c.logprobs])
    recorded = [torch.tensor(c.logprobs, dtype=torch.float64) for c in comps]
    diffs = [
        (learner[i, completion_span(len(p), len(c.token_ids))] - recorded[i]).abs().max().item()
        for i, (p, c) in enumerate(zip(prompts, comps))
    ]
    with capsys.disabled():
        print(f"\n  T={temperature} top_p={top_p} top_k={top_k}: max |engine - learner| log-prob = {max(diffs):.2e}"
              f" (float64 weights; bound {tol:.2e})")
    assert max(diffs) <= tol


def test_greedy_is_deterministic_and_equals_top_k_1(engine):
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=5)
    a = [r.completions[0].text for r in engine.generate(PROMPTS, greedy)]
    b = [r.completions[0].text for r in engine.generate(PROMPTS, greedy)]
    k1 = [r.completions[0].text for r in engine.generate(PROMPTS, SamplingParams(n=1, top_k=1, max_new_tokens=5))]
    assert a == b == k1


def test_load_weights_changes_outputs_and_version():
    tok = load_tokenizer(BUILTIN_MODEL)
    eng = HFEngine(load_model(BUILTIN_MODEL), tok, BUILTIN_MODEL)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=5)
    before = [r.completions[0].logprobs for r in eng.generate(PROMPTS, greedy)]
    sd = {k: v + 0.05 * torch.randn_like(v) for k, v in eng.model.state_dict().items()}
    eng.load_weights(sd, version=7)
    after = [r.completions[0].logprobs for r in eng.generate(PROMPTS, greedy)]
    assert eng.version == 7 and before != after


def test_builtin_models_load_from_local_files_only():
    for mid in (BUILTIN_MODEL, BUILTIN_MODEL_B):
        path = resolve_model_path(mid)
        assert path.endswith(mid.split(":")[1])
    with pytest.raises(FileNotFoundError, match="no built-in model .builtin:nope. .built-in: builtin:tiny-arith, "):
        resolve_model_path("builtin:nope")
    m = load_model(BUILTIN_MODEL)
    assert m.config.model_type == "qwen3" and sum(p.numel() for p in m.parameters()) < 2_000_000


def test_the_vllm_engine_flags_a_completion_whose_tokens_our_race_did_not_pick_and_no_other():
    """vLLM's engine checks that its logits processor recorded every token of every completion. A
    position past a completion's end is normal (with async scheduling, vLLM's default on GPUs, a
    request that ended on EOS is raced once more before its end is known); one missing is not."""
    from node.engines.vllm import unraced  # vLLM itself is imported lazily: this runs without it

    taken = {0: {0: -0.1, 1: -0.2}, 1: {0: -0.3, 1: -0.4, 2: -0.5}, 2: {1: -0.6}}
    assert unraced([2, 2, 2], taken) == [2]  # row 1's position 2 is the extra race after its EOS
    assert unraced([2, 3, 0, 1], taken) == [3]  # an empty completion needs nothing; row 3 was never raced
