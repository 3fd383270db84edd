"""From scored groups to an optimizer step: alignment, skipping, parameters changing, bad batches."""

import math

import pytest
import torch

from node.algorithms import get_algorithm
from node.engines.base import Completion
from node.models import BUILTIN_MODEL, load_model, load_tokenizer
from node.trainer import ScoredGroup, TrainPart, build_batch, train_step


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
