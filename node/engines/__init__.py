"""Generation engines behind one interface (`Engine`): HF transformers by default, vLLM optional."""

from .base import Completion, Engine, PromptResult, SamplingParams

__all__ = ["Completion", "Engine", "PromptResult", "SamplingParams"]
