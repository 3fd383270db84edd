"""Instruct models and real tasks: chat-template prompts, EOS ids from the generation config, and
long completions whose behaviour log-probs are recorded step by step (no [rows, steps, V] logits)."""

import json
import shutil

import pytest
import torch

from node.sampling.race import keys_tensor, position_keys, race_margins
from node.sampling.params import SamplingParams
from node.engines.hf import HFEngine
from node.training.logprobs import completion_logits, completion_logprobs, completion_span, pack
from node.models import (BUILTIN_MODEL, build_char_tokenizer, eos_token_ids, load_model, load_tokenizer,
                         resolve_model_path)
from node.tasks import DatasetTask, DatasetTaskConfig, make_task
from node.tasks.dataset import _problem_id
from helpers.numerics import float32_logprob_tol

# Qwen3-like: <|im_start|>role\ncontent<|im_end|>\n per message, the assistant's generation prompt,
# and an empty think block when thinking is switched off
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}"
    "{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tok():
    tok = build_char_tokenizer()
    tok.add_special_tokens({"bos_token": "<|bos|>", "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture
def qa_file(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text("\n".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) for i in range(40)))
    return str(f)


def test_prompts_are_the_rendered_chat_with_system_prompt_and_options(chat_tok, qa_file):
    cfg = DatasetTaskConfig(train_files=(qa_file,), eval_fraction=0.2, system_prompt="Be brief.",
                            template_options={"enable_thinking": False})
    task = make_task(cfg, chat_tok)
    plain = DatasetTask(DatasetTaskConfig(train_files=(qa_file,), eval_fraction=0.2))
    p = task.split("train")[0]
    question = f"What is {int(p.answer) // 2} + {int(p.answer) // 2}?"
    user = cfg.prompt_template.format(question=question).strip()
    expected = chat_tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": user}],
                                            tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert p.prompt == expected
    assert p.prompt.startswith("<|bos|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + question + "\nPut the final")
    assert p.prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    # engines and the learner tokenize prompt text without special tokens: one BOS, the template's
    ids = chat_tok(p.prompt, add_special_tokens=False)["input_ids"]
    assert ids.count(chat_tok.bos_token_id) == 1 and ids[0] == chat_tok.bos_token_id
    assert ids[1] == chat_tok.convert_tokens_to_ids("<|im_start|>")
    # ids hash the question, not the template: the same problems under both renderings
    assert [q.id for q in task.split("train")] == [q.id for q in plain.split("train")]
    assert [q.id for q in task.split("eval")] == [q.id for q in plain.split("eval")]
    assert task.get(p.id) == p and plain.get(p.id).prompt == cfg.prompt_template.format(question=question)


def test_thinking_switch_system_prompt_and_template_modes(chat_tok, qa_file):
    def first(tok=chat_tok, **kw):  # the prompt of "What is 0 + 0?"
        return DatasetTask(DatasetTaskConfig(train_files=(qa_file,), eval_fraction=0.2, **kw), tok).get(zero).prompt

    zero = _problem_id("What is 0 + 0?")

    thinking, no_thinking = first(template_options={"enable_thinking": True}), first(template_options={"enable_thinking": False})
    assert thinking != no_thinking and "<think>" not in thinking and thinking.endswith("<|im_start|>assistant\n")
    assert first() == thinking  # options default to none: the template's own default
    assert "system" not in first()  # no system message when system_prompt is empty
    plain = DatasetTaskConfig(train_files=(qa_file,)).prompt_template.format(question="What is 0 + 0?")
    assert first(chat_template="off") == plain  # off: the plain prompt_template text
    assert first(tok=None) == plain  # no tokenizer: as before chat templates
    no_template = build_char_tokenizer()
    assert first(tok=no_template) == plain  # auto: a tokenizer without a chat template
    with pytest.raises(ValueError, match="no chat template"):
        DatasetTask(DatasetTaskConfig(train_files=(qa_file,), chat_template="on"), no_template)
    with pytest.raises(ValueError, match="no tokenizer"):
        make_task(DatasetTaskConfig(train_files=(qa_file,), chat_template="on"))


def test_chat_options_in_config_tables(qa_file):
    from node.config import ConfigError, task_from_dict

    cfg = task_from_dict({"kind": "dataset", "train_files": [qa_file], "chat_template": "on",
                          "system_prompt": "Reason step by step.", "template_options": {"enable_thinking": False}})
    assert isinstance(cfg, DatasetTaskConfig) and cfg.template_options == {"enable_thinking": False}
    with pytest.raises(ConfigError, match="chat_template must be one of"):
        task_from_dict({"kind": "dataset", "train_files": [qa_file], "chat_template": "yes"})
    with pytest.raises(ConfigError, match="may not set .'tokenize'."):
        task_from_dict({"kind": "dataset", "train_files": [qa_file], "template_options": {"tokenize": True}})


@pytest.fixture
def two_eos_model(tmp_path):
    """The built-in model in a folder whose generation_config.json stops on <eos> and on '1'."""
    path = tmp_path / "tiny-two-eos"
    shutil.copytree(resolve_model_path(BUILTIN_MODEL), path)
    one = load_tokenizer(BUILTIN_MODEL).convert_tokens_to_ids("1")
    gen = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [1, one]}))
    return str(path), one


def test_eos_ids_union_the_tokenizers_and_the_generation_configs(two_eos_model, tmp_path):
    path, one = two_eos_model
    tok = load_tokenizer(path)
    assert eos_token_ids(tok, path) == [tok.eos_token_id, one]  # tokenizer's first, no repeat
    assert eos_token_ids(tok, BUILTIN_MODEL) == [tok.eos_token_id]  # an int in the file
    gen = json.loads((tmp_path / "tiny-two-eos" / "generation_config.json").read_text())
    (tmp_path / "tiny-two-eos" / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [one, 7]}))
    assert eos_token_ids(tok, path) == [tok.eos_token_id, one, 7]
    (tmp_path / "tiny-two-eos" / "generation_config.json").unlink()
    assert eos_token_ids(tok, path) == [tok.eos_token_id]  # no file: the tokenizer's
    assert eos_token_ids(tok, "no-such-org/no-such-model") == [tok.eos_token_id]  # never the network


def test_hf_engine_stops_on_any_eos_id(two_eos_model):
    path, one = two_eos_model
    tok = load_tokenizer(path)
    engine = HFEngine(load_model(path), tok, path)
    assert engine.eos_ids == [tok.eos_token_id, one]
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=6)
    # the built-in model answers 12+7= with "16<eos>" and 99+99= with "198<eos>" (greedy)
    for r in engine.generate(["12+7=", "99+99="], greedy):
        c = r.completions[0]
        assert c.token_ids == [one] and c.finish_reason == "stop" and c.text == "1" and len(c.logprobs) == 1
    torch.manual_seed(0)
    sampled = engine.generate(["12+7=", "35+48=", "99+99=", "61+50="], SamplingParams(n=8, max_new_tokens=6))
    comps = [c for r in sampled for c in r.completions]
    assert any(c.token_ids[-1] == one for c in comps)
    for c in comps:
        assert not set(c.token_ids[:-1]) & {1, one} and len(c.logprobs) == len(c.token_ids)
        assert c.finish_reason == ("stop" if c.token_ids[-1] in (1, one) else "length")


@pytest.mark.parametrize("temperature,top_p,top_k,seeded", [(1.0, 1.0, 0, False), (0.8, 0.9, 0, True)])
def test_long_completions_record_the_learners_logprobs_without_full_logits(temperature, top_p, top_k, seeded):
    tok = load_tokenizer(BUILTIN_MODEL)
    # float64 weights: the engine's and the learner's forwards agree to ~1e-15, so the gap left is
    # the engine's float32 log-softmax, bounded on any CPU by numerics.float32_logprob_tol
    model = load_model(BUILTIN_MODEL, torch.float64)
    prompts = ["12+7=", "7*8=", "99+99="]
    steps = model.config.max_position_embeddings - 16  # 240: the tiny model's positions end at 256
    assert steps + len("99+99=") <= min(model.config.max_position_embeddings, tok.model_max_length)
    params = SamplingParams(n=3, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=steps)
    seeds = [[bytes([i, j]) * 8 for j in range(3)] for i in range(len(prompts))] if seeded else None
    calls = []
    for eos_ids in ([], None):  # no EOS: every row runs the full length; the model's: rows stop unevenly
        engine = HFEngine(model, tok, BUILTIN_MODEL, eos_ids=eos_ids)
        generate = engine.model.generate
        engine.model.generate = lambda *a, **kw: calls.append(kw["generation_config"]) or generate(*a, **kw)
        torch.manual_seed(1)
        try:
            res = engine.generate(prompts, params, seeds)
        finally:
            del engine.model.generate
        rows = [(r.prompt_token_ids, c) for r in res for c in r.completions]
        if eos_ids == []:
            assert all(len(c.token_ids) == steps and c.finish_reason == "length" for _, c in rows)
        batch = pack([p for p, _ in rows], [c.token_ids for _, c in rows], tok.pad_token_id)
        with torch.no_grad():
            learner = completion_logprobs(model, batch, params.logprob_temperature)
            logits = torch.cat([z for _, z in completion_logits(model, batch)])
        tol = float32_logprob_tol(logits, params.logprob_temperature, [lp for _, c in rows for lp in c.logprobs])
        for i, (p, c) in enumerate(rows):
            assert len(c.logprobs) == len(c.token_ids)
            recorded = torch.tensor(c.logprobs, dtype=torch.float64)
            diff = (learner[i, completion_span(len(p), len(c.token_ids))] - recorded).abs().max()
            assert diff.item() <= tol, (i, diff.item(), tol)
        if seeded:  # every token is the race's (keys derived KEY_BLOCK positions at a time, across blocks)
            keys = keys_tensor([k for (_, c), s in zip(rows, [s for row in seeds for s in row])
                                for k in position_keys(s, len(c.token_ids))])
            tokens = torch.tensor([t for _, c in rows for t in c.token_ids])
            margins = race_margins(logits, tokens, keys, temperature, top_k, top_p)
            # the engine raced in float32 on these float64 logits: its scores are off by float32 rounding
            rounding = 4 * logits.abs().max().item() / temperature * 2.0**-24
            assert margins.max().item() <= temperature * rounding, margins.max().item()
    assert calls and not any(g.output_logits or g.output_scores for g in calls)
