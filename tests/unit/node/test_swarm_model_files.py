"""A sampler given no model runs the learner's from its files and keyframe (node/models.py
`model_files`, `empty_model`; node/sampling/sampler.py `weightless`): built from the config alone, it
generates nothing until the keyframe is loaded, and then exactly what the learner's model would."""

from __future__ import annotations

import torch

from node.engines import make_engine
from node.engines.hf import HFEngine
from node.models import BUILTIN_MODEL, empty_model, has_weights, load_model, load_tokenizer, model_files, resolve_model_path
from node.sampling.sampler import Sampler
from node.models import tokenizer_hash
from swarm.model_files import unpack_to
from swarm.wire.model_files import ModelFiles
from helpers.inmemory import tiny_swarm


def files_folder(tmp_path):
    tok = load_tokenizer(BUILTIN_MODEL)
    blob = ModelFiles(model_id=BUILTIN_MODEL, files=model_files(BUILTIN_MODEL, tok)).pack()
    return unpack_to(blob, tmp_path / "files"), tmp_path / "files"


def test_the_files_hold_config_tokenizer_and_generation_config_and_no_weights(tmp_path) -> None:
    bundle, folder = files_folder(tmp_path)
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(bundle.files)
    assert not has_weights(folder) and has_weights(resolve_model_path(BUILTIN_MODEL))
    assert tokenizer_hash(load_tokenizer(str(folder))) == tokenizer_hash(load_tokenizer(BUILTIN_MODEL))


def test_a_model_from_the_config_with_the_learners_weights_is_the_learners_model(tmp_path) -> None:
    _, folder = files_folder(tmp_path)
    ref = load_model(BUILTIN_MODEL)
    built = empty_model(folder)
    built.load_state_dict(ref.state_dict(), strict=True)  # what a keyframe does (HFEngine.load_weights)
    x = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():  # same weights, same kernels, one process: bit-equal
        assert torch.equal(built(x).logits, ref(x).logits)


def test_a_weightless_sampler_generates_nothing_before_the_keyframe_then_the_learners_tokens(tmp_path) -> None:
    _, folder = files_folder(tmp_path)
    s = tiny_swarm(start=True, samplers=0)
    tok = load_tokenizer(str(folder))
    engine = make_engine("hf", BUILTIN_MODEL, tok, path=str(folder))
    assert isinstance(engine, HFEngine) and engine.model_id == BUILTIN_MODEL
    sampler = Sampler("w", s.task, engine, tokenizer_hash(tok), sampling=s.sampling, swarm=s.learner.swarm,
                      prompts_per_batch=2, weightless=True)
    empty = tiny_swarm().exchange.sampler("w")  # a learner that has published nothing
    assert sampler.run_once(empty) == 0 and sampler.waiting_for_weights
    assert sampler.maybe_update(s.link("w")) and not sampler.waiting_for_weights
    ref = Sampler("w", s.task, HFEngine(load_model(BUILTIN_MODEL), tok, BUILTIN_MODEL), tokenizer_hash(tok),
                  sampling=s.sampling, swarm=s.learner.swarm, prompts_per_batch=2)
    ref.maybe_update(s.link("ref"))
    ours, theirs = sampler.produce(), ref.produce()
    assert [c.token_ids for g in ours for c in g.completions] == [c.token_ids for g in theirs for c in g.completions]
    assert [g.model_id for g in ours] == [BUILTIN_MODEL] * 2
