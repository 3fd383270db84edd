"""The built-in arithmetic model under a real vocabulary (151,936 tokens), for swarms that must
earn credit at a real vocabulary's size: a 151k-row output head and embedding, the bytes of a
real tokenizer, and groups whose rewards differ (random weights answer nothing right).

Its first 99 tokens are the built-in model's characters (examples/model_shapes.tokenizer keeps
their ids), with their rows; every other row is zero, so each filler token's logit is 0. The final
norm's weight is scaled by `SHARPEN`, so the characters' logits clear ln(151,936) ~ 12 and the
fillers, together, take a few percent of the mass: the model still answers 40-60% of its problems,
measured: 6 of 16 groups of 8 had rewards that differ (2 of 16 at x2, 0 at x1)."""

from __future__ import annotations

from pathlib import Path

VOCAB = 151936
SHARPEN = 3.0


def save_wide_arith(folder: Path, vocab: int = VOCAB, sharpen: float = SHARPEN) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from examples.model_shapes import tokenizer
    from node.models import BUILTIN_MODEL, load_model, resolve_model_path

    small = load_model(BUILTIN_MODEL)
    config = AutoConfig.from_pretrained(resolve_model_path(BUILTIN_MODEL))
    config.vocab_size = vocab
    wide = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = wide.state_dict()
    for name, tensor in small.state_dict().items():
        grown = torch.zeros_like(state[name])
        grown[:tensor.shape[0]] = tensor  # an embedding or head grows in rows; every other tensor is whole
        state[name] = grown
    wide.load_state_dict(state)
    with torch.no_grad():
        wide.model.norm.weight.mul_(sharpen)
    wide.save_pretrained(folder)
    tokenizer(vocab).save_pretrained(folder)
    return folder
