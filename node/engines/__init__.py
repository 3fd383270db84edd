"""Generation engines behind one interface (`Engine`): HF transformers by default, vLLM optional."""

from __future__ import annotations

from node.engines.base import Completion, Engine, PromptResult
from node.sampling.params import SamplingParams

ENGINES = ("hf", "vllm")


def make_engine(kind: str, model_id: str, tokenizer, vllm=None, placement=None, path: str | None = None) -> Engine:
    """The engine `kind` serving `model_id`; a ConfigError (with the fix) if it cannot run here.

    `placement` (node.device.Placement; default CPU float32) is where the HF engine's weights live
    and their dtype; vLLM places itself (its own [vllm] settings). `path`: the model's folder where it
    is not `model_id`'s own (the swarm's model from its learner's files: swarm/model_files.py); a
    folder without weights makes a model whose weights come as the learner's keyframe."""
    from node.config import ConfigError

    if kind == "hf":
        from node.models import eos_token_ids, empty_model, has_weights, load_model
        from node.engines.hf import HFEngine

        where = {} if placement is None else {"dtype": placement.dtype, "device": placement.device}
        if path is None or path == model_id:
            return HFEngine(load_model(model_id, **where), tokenizer, model_id)
        model = load_model(path, **where) if has_weights(path) else empty_model(path, **where)
        return HFEngine(model, tokenizer, model_id, eos_ids=eos_token_ids(tokenizer, path))
    if kind == "vllm":
        from node.engines.vllm import VLLMConfig, VLLMEngine, vllm_available

        if not vllm_available():
            from node.engines.vllm_settings import install_hint

            gpu = None if placement is None else placement.device.type == "cuda"
            raise ConfigError("--engine vllm: vLLM is not installed in this environment", install_hint(gpu))
        return VLLMEngine(model_id, tokenizer, vllm or VLLMConfig(), path=path)
    raise ConfigError(f"unknown engine {kind!r}", f"use one of {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Completion", "Engine", "PromptResult", "SamplingParams", "make_engine"]
