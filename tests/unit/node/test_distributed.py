"""FSDP2's calls (node/training/distributed.py) in one process, without torchrun: no process group,
and the state gathers and loads back on the plain model, so the learner has one code path. Two gloo
ranks under torchrun training exactly as one process does:
tests/integration/node/test_distributed_ranks.py.
"""

from __future__ import annotations

import pytest
import torch


def test_one_process_needs_no_process_group_and_its_state_round_trips(monkeypatch):
    """Without torchrun the same calls work on the plain model: the learner has one code path."""
    from node.training.distributed import decoder_layers, full_state_dict, init_from_env, load_full_state, optimizer_state
    from node.models import BUILTIN_MODEL, load_model

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert init_from_env("cpu") is None
    with pytest.raises(ValueError, match="no decoder layers"):
        decoder_layers(torch.nn.Linear(2, 2))
    lm = load_model(BUILTIN_MODEL)
    assert len(decoder_layers(lm)) == lm.config.num_hidden_layers
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-3, weight_decay=0.0)
    loss = lambda: sum(p.square().sum() for p in lm.parameters())  # noqa: E731
    loss().backward()
    opt.step()
    weights = {k: v.clone() for k, v in full_state_dict(lm).items()}
    assert list(weights) == list(lm.state_dict())
    optim = optimizer_state(lm, opt)
    assert "lm_head.weight" not in optim["state"] and float(optim["state"]["model.norm.weight"]["step"]) == 1
    opt.zero_grad()
    loss().backward()
    opt.step()  # a snapshot: the step does not change what optimizer_state returned
    assert float(optim["state"]["model.norm.weight"]["step"]) == 1
    load_full_state(lm, opt, weights, optim)
    assert all(torch.equal(v, weights[k]) for k, v in lm.state_dict().items())
    assert float(opt.state[lm.model.norm.weight]["step"]) == 1
    assert torch.equal(opt.state[lm.model.norm.weight]["exp_avg"], optim["state"]["model.norm.weight"]["exp_avg"])
    fresh = torch.optim.AdamW(lm.parameters(), lr=1e-3, weight_decay=0.0)  # a learner resuming at start-up
    load_full_state(lm, fresh, None, optim)
    assert all(torch.equal(v, weights[k]) for k, v in lm.state_dict().items())  # the weights stay
    assert torch.equal(fresh.state[lm.lm_head.weight]["exp_avg_sq"], optim["state"]["model.embed_tokens.weight"]["exp_avg_sq"])
