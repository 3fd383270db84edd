"""Tasks and rewards: determinism, disjoint splits, tricky answers, local dataset files."""

import json

import pytest

from node.tasks import (ArithmeticConfig, ArithmeticTask, DatasetTask, DatasetTaskConfig,
                        exact_int_match, load_reward, math_verify_reward, PromptStream)


def test_arithmetic_splits_are_disjoint_deterministic_and_correct():
    a, b = ArithmeticTask(), ArithmeticTask()
    train, held = a.split("train"), a.split("eval")
    assert {p.prompt for p in train}.isdisjoint({p.prompt for p in held})
    assert [p.id for p in held] == [p.id for p in b.split("eval")]
    assert 0.07 < len(held) / (len(train) + len(held)) < 0.13
    for p in list(train)[:50] + list(held)[:50]:
        x, op, y = p.prompt[:-1].partition("+") if "+" in p.prompt else p.prompt[:-1].partition("*")
        assert int(p.answer) == (int(x) + int(y) if op == "+" else int(x) * int(y))
        assert a.get(p.id) == p
    assert a.get("arith:1+1000") is None


def test_arithmetic_difficulty_knob_and_config_errors():
    easy = ArithmeticTask(ArithmeticConfig(digits=1, ops=("+",)))
    assert len(easy.split("train")) + len(easy.split("eval")) == 100
    hard = ArithmeticTask(ArithmeticConfig(digits=3, mul_digits=2))
    assert max(len(p.answer) for p in hard.split("train")) == 5  # 999 * 99 = 98901
    with pytest.raises(ValueError, match="digits"):
        ArithmeticConfig(digits=5)
    with pytest.raises(ValueError, match="ops"):
        ArithmeticConfig(ops=("-",))


def test_prompt_stream_is_seeded():
    probs = ArithmeticTask().split("train")
    ids = lambda s, n=20: [p.id for p in s.take(n)]  # noqa: E731
    assert ids(PromptStream(probs, 3)) == ids(PromptStream(probs, 3))
    assert ids(PromptStream(probs, 3)) != ids(PromptStream(probs, 4))
    # the position is the whole state: resuming at 7 continues the same sequence
    assert ids(PromptStream(probs, 3), 27)[7:] == ids(PromptStream(probs, 3, position=7))
    # every problem once per pass
    small = probs[:10]
    assert sorted(p.id for p in PromptStream(small, 1).take(10)) == sorted(p.id for p in small)


@pytest.mark.parametrize("completion,answer,expected", [
    ("42", "42", 1.0), (" 42 ", "42", 1.0), ("042", "42", 0.0), ("42.0", "42", 0.0),
    ("4 2", "42", 0.0), ("42 43", "42", 0.0), ("", "0", 0.0), ("-7", "-7", 1.0), ("42\n", "42", 1.0),
])
def test_exact_int_match(completion, answer, expected):
    assert exact_int_match(completion, answer) == expected


@pytest.mark.parametrize("completion,answer,expected", [
    ("so the answer is \\boxed{1/2}", "0.5", 1.0),
    ("\\boxed{\\frac{1}{2}}", "1/2", 1.0),
    ("The total is 1,000", "1000", 1.0),
    ("\\boxed{1000}", "1,000", 1.0),
    ("first \\boxed{3}, wait, no: \\boxed{4}", "4", 1.0),  # the last box counts
    ("first \\boxed{3}, wait, no: \\boxed{4}", "3", 0.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{{5}}", "5", 1.0),  # nested braces
    ("\\boxed{-7}", "7", 0.0),
    ("I don't know", "5", 0.0),
    ("\\boxed{\\frac{1}{0}}", "1", 0.0),  # nonsense must give 0, not raise
])
def test_math_verify_reward_on_tricky_answers(completion, answer, expected):
    assert math_verify_reward(completion, answer) == expected


def test_load_reward_by_name_and_import_path():
    assert load_reward("exact_int") is exact_int_match
    assert load_reward("node.tasks.rewards:math_verify_reward") is math_verify_reward
    with pytest.raises(ValueError, match="import path"):
        load_reward("nope")
    with pytest.raises(ValueError, match="no callable"):
        load_reward("node.tasks.rewards:missing")


def test_dataset_task_from_jsonl_with_hash_split(tmp_path):
    f = tmp_path / "qa.jsonl"
    f.write_text("\n".join(json.dumps({"q": f"What is {i} + {i}?", "a": str(2 * i)}) for i in range(400)))
    t = DatasetTask(DatasetTaskConfig(train_files=(str(f),), question_field="q", answer_field="a"))
    train, held = t.split("train"), t.split("eval")
    assert len(train) + len(held) == 400 and 5 <= len(held) <= 40
    assert {p.id for p in train}.isdisjoint({p.id for p in held})
    p = train[0]
    assert p.prompt.startswith("What is") and "\\boxed{}" in p.prompt
    assert t.reward(f"... \\boxed{{{p.answer}}}", p.answer) == 1.0
    assert t.get(p.id) == p


def test_dataset_task_from_parquet_with_eval_file_and_field_errors(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"question": ["1+1?", "2+2?", "3+3?"], "answer": ["2", "4", "6"]}
    pq.write_table(pa.table(rows), tmp_path / "train.parquet")
    pq.write_table(pa.table({"question": ["3+3?"], "answer": ["6"]}), tmp_path / "eval.parquet")
    t = DatasetTask(DatasetTaskConfig(train_files=(str(tmp_path / "train.parquet"),),
                                      eval_files=(str(tmp_path / "eval.parquet"),)))
    assert [p.answer for p in t.split("train")] == ["2", "4"] and [p.answer for p in t.split("eval")] == ["6"]
    bad = DatasetTask(DatasetTaskConfig(train_files=(str(tmp_path / "train.parquet"),), question_field="problem"))
    with pytest.raises(ValueError, match="lack the field"):
        bad.split("train")
    with pytest.raises(ValueError, match="jsonl"):
        DatasetTaskConfig(train_files=("x.csv",))


# ---- the chain task (long scratchpad completions) ----------------------------------------------------

def test_chain_scratchpad_and_final_answer_reward():
    from node.tasks.chain import ChainTask, final_answer_match, scratchpad

    assert scratchpad([37, 58, 12, 91]) == "37+58=95\n95+12=107\n107+91=198\n#198"
    assert final_answer_match("37+58=95\n#95", "95") == 1.0
    assert final_answer_match("anything at all\n#95 ", "95") == 1.0  # only the answer is verified
    for wrong in ("#96", "95", "#95\n#95", "#095", "#95 and more", "# 95", ""):
        assert final_answer_match(wrong, "95") == 0.0, wrong
    task = ChainTask()
    p = task.split("train")[0]
    assert task.reward(ChainTask.worked(p), p.answer) == 1.0 and task.get(p.id) == p


def test_chain_pool_is_the_same_on_every_peer_with_disjoint_splits_and_long_completions():
    from node.tasks import ChainConfig, ChainTask

    a, b = ChainTask(ChainConfig(pool=3000)), ChainTask(ChainConfig(pool=3000))
    assert [p.id for p in a.split("train")] == [p.id for p in b.split("train")]
    train, held = {p.prompt for p in a.split("train")}, {p.prompt for p in a.split("eval")}
    assert not train & held and len(train) + len(held) == 3000 and 0.02 < len(held) / 3000 < 0.08
    lengths = [len(ChainTask.worked(p)) for p in a.split("train")]
    assert min(lengths) >= 30 and max(lengths) <= 90  # 4-8 terms: the paper's regime, not 1-4 tokens
    for p in a.split("eval")[:50]:
        terms = [int(t) for t in p.prompt[:-1].split("+")]
        assert 4 <= len(terms) <= 8 and all(10 <= t <= 99 for t in terms) and p.answer == str(sum(terms))


def test_chain_config_errors_and_kind_in_the_config_tree():
    from node.config import task_from_dict
    from node.tasks import ChainConfig

    for bad in ({"min_terms": 1}, {"min_terms": 5, "max_terms": 4}, {"max_terms": 13}, {"pool": 10},
                {"eval_fraction": 1.0}, {"min_terms": 2, "max_terms": 2}):  # the last: 8,100 sums, pool 60,000
        with pytest.raises(ValueError):
            ChainConfig(**bad)
    assert task_from_dict({"kind": "chain", "max_terms": 6}) == ChainConfig(max_terms=6)
